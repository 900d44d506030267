"""From a captured graph to the aten graphs that are partitioned.

* :mod:`~ort_lazy.lowering.decompositions`: which decompositions AOTAutograd applies;
* :mod:`~ort_lazy.lowering.rewrites`: the table of rewrites into ops ORT runs well (exact
  decompositions), assembled from one module per topic (:mod:`~ort_lazy.lowering.arithmetic`,
  :mod:`~ort_lazy.lowering.reductions`, :mod:`~ort_lazy.lowering.pooling`, ...);
* :mod:`~ort_lazy.lowering.fast_paths` and :func:`~ort_lazy.lowering.pooling.drop_unused_indices`:
  graph passes before lowering (fused fast paths, unread pooling indices);
* :mod:`~ort_lazy.lowering.aten`: the aten lowering itself (AOTAutograd, or ``make_fx`` for
  no-grad graphs) shared by the dynamo and fx front doors.
"""

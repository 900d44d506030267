"""From a captured graph to the aten graphs that are partitioned.

* :mod:`~ort_lazy.lowering.decompositions`: which decompositions AOTAutograd applies;
* :mod:`~ort_lazy.lowering.rewrites`: rewrites into ops ORT runs well (fast paths, exact
  decompositions, unread pooling indices);
* :mod:`~ort_lazy.lowering.aten`: the aten lowering itself (AOTAutograd, or ``make_fx`` for
  no-grad graphs) shared by the dynamo and fx front doors.
"""

"""Which decompositions AOTAutograd applies before a graph is partitioned.

Chosen the way Inductor and ``torch.export`` choose theirs, never by taking all of
``torch._decomp.decomposition_table``: that table also holds decompositions that are not
functional (``aten.lift_fresh -> alias`` breaks every graph holding a ``torch.tensor(...)``
constant under fake tensors; ``diagonal_scatter``, ``diagonal_copy`` and the linalg
decompositions write through ``prims.copy_to``) and formulas that lose accuracy.

The table is:

1. torch's core ATen decompositions (``torch.export.default_decompositions()``), for ops the
   exporter does not translate whole;
2. :data:`EXTRA`: single entries of torch's full table, each checked to be functional and
   tested (training graphs need them to stay on ORT);
3. decompositions of :data:`ort_lazy.support.DISTRUSTED` ops (whose whole-op translations are
   wrong);
4. ort-lazy's own rewrites into ops ORT runs fast (:data:`ort_lazy.lowering.rewrites.DECOMPOSITIONS`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..support import DISTRUSTED, registered_ops
from .rewrites import DECOMPOSITIONS

__all__ = ["decomposition_table", "EXTRA"]

_aten = torch.ops.aten

#: entries of ``torch._decomp.decomposition_table`` outside the core set that ort-lazy uses
EXTRA = (
    # max pooling's backward: indices -> a scatter-free gather of gradients (CNN training)
    _aten.max_pool2d_with_indices_backward.default,
    # index factories (no ONNX translation): arange arithmetic
    _aten.tril_indices.default,
    _aten.triu_indices.default,
)


def _functional(op: Any) -> bool:
    """Neither writes into an argument nor returns an alias (``out=`` forms, views: functional
    graphs never hold them, and make_fx decomposes composite views by itself)."""
    schema = op._schema
    return not schema.is_mutable and not any(r.alias_info is not None for r in schema.returns)


@functools.lru_cache(maxsize=8)
def decomposition_table(cache_dir: str | None = None) -> dict[Any, Any]:
    """The decompositions for AOTAutograd (see the module docstring).

    Built without importing the exporter when the compile cache holds the list of translated
    ops, so a warm process never loads it.
    """
    translated = set(registered_ops(cache_dir)) - set(DISTRUSTED)
    full = torch._decomp.decomposition_table
    table: dict[Any, Any] = {}
    for op, fn in torch.export.default_decompositions().items():
        if hasattr(op, "_schema") and op not in translated and _functional(op):
            table[op] = fn
    for op in EXTRA:
        if op not in translated and op in full:
            table[op] = full[op]
    for op in DISTRUSTED:
        if op not in table and op in full:
            table[op] = full[op]
    table.update(DECOMPOSITIONS)
    return table

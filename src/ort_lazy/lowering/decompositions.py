"""Which decompositions AOTAutograd applies before a graph is partitioned.

Selected the way Inductor selects its table (a base set, minus an explicit exclusion list),
never by taking ``torch._decomp.decomposition_table`` whole: that table also holds
decompositions that are not functional (``aten.lift_fresh -> alias`` of a real constant breaks
every graph holding a ``torch.tensor(...)`` under fake tensors; ``diagonal_scatter`` writes
through ``prims.copy_to``, which AOTAutograd rejects in diag, diagonal_copy, qr, ormqr ...).

The table, for ops the exporter does not translate whole (or translates wrongly):

1. torch's core ATen decompositions (``torch.export.default_decompositions()``) and the rest of
   torch's table, without ``out=``/in-place overloads (graphs here are functional) and
   without :data:`EXCLUDED` (each with its reason);
2. decompositions of :data:`ort_lazy.support.DISTRUSTED` ops, and of CPU attention
   (``_scaled_dot_product_flash_attention_for_cpu``) except where ORT runs it whole;
3. ort-lazy's own rewrites into ops ORT runs fast (:data:`ort_lazy.lowering.rewrites.DECOMPOSITIONS`),
   and the fused multiply-add dynamo writes for ``addcmul_``/``addcdiv_`` with a value (every
   optimizer step) as a product and a sum.

An op with no decomposition and no translation stays in PyTorch.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .. import _compat
from ..export import attention
from ..opnames import named_in
from ..support import DISTRUSTED, registered_ops
from .products import fma
from .rewrites import DECOMPOSITIONS
from .special import SPECIAL_DECOMPOSITIONS

__all__ = ["decomposition_table", "EXCLUDED"]

_aten = torch.ops.aten

def _excluded() -> dict[Any, str]:
    aten = torch.ops.aten
    random = "random: stays in PyTorch so results follow torch's random stream"
    return {
        aten.lift_fresh.default: "an alias of a real constant tensor (breaks fake-tensor tracing)",
        aten.lift.default: "an alias of a real constant tensor (breaks fake-tensor tracing)",
        aten.diagonal_scatter.default: "writes through prims.copy_to (not functional)",
        **{
            op: random
            for op in (
                aten.cauchy.default, aten.exponential.default, aten.geometric.default, aten.log_normal.default,
                aten.uniform.default, aten._fused_dropout.default, aten.alpha_dropout.default,
                aten.rrelu_with_noise_backward.default,
            )
        },
    }


#: decompositions of torch's table that ort-lazy never applies, with the reason
EXCLUDED: dict[Any, str] = _excluded()


def _functional(op: Any) -> bool:
    """Writes into none of its arguments (``out=`` and in-place overloads never appear in the
    functional graphs decomposed here)."""
    return hasattr(op, "_schema") and not op._schema.is_mutable


_FLASH = _aten._scaled_dot_product_flash_attention_for_cpu.default


def _attention_or_decomposed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> Any:
    """CPU attention kept whole where ORT runs it as one ``Attention``
    (:mod:`ort_lazy.export.attention`), else torch's decomposition (``NotImplemented`` keeps
    the op in the traced graph)."""
    if attention.FUSED_ON_CPU and attention.not_fusable(query, key, value, dropout_p, is_causal, attn_mask) is None:
        return NotImplemented
    return torch._decomp.decomposition_table[_FLASH](
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )


@functools.lru_cache(maxsize=8)
def decomposition_table(cache_dir: str | None = None, kept: frozenset[str] = frozenset()) -> dict[Any, Any]:
    """The decompositions for AOTAutograd (see the module docstring).

    ``kept``: op names (``aten.relu`` or ``aten.relu.default``) never decomposed, so that
    ``torch_executed_ops`` / ``torch_preferred_ops`` find them whole in the graph. Built without
    importing the exporter when the compile cache holds the list of translated ops, so a warm
    process never loads it.
    """
    # first: importing the op registers more ops, whose decompositions the table then lists
    fused = _compat.fused_multiply_add()
    translated = set(registered_ops(cache_dir)) - set(DISTRUSTED)
    table: dict[Any, Any] = {}
    for source in (torch.export.default_decompositions(), torch._decomp.decomposition_table):
        for op, fn in source.items():
            if op in table or op in translated or op in EXCLUDED or not _functional(op):
                continue
            table[op] = fn
    full = torch._decomp.decomposition_table
    for op in DISTRUSTED:
        if op not in table and op in full:
            table[op] = full[op]
    table.update(SPECIAL_DECOMPOSITIONS)
    table.update(DECOMPOSITIONS)
    table[_FLASH] = _attention_or_decomposed
    if fused is not None:
        table[fused] = fma
    for op in [op for op in table if named_in(op, kept)]:
        del table[op]
    return table

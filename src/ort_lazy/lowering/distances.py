"""Pairwise distances and sorted search in ops ORT runs.

``cdist``, ``pdist`` (``_cdist_forward``, ``_pdist_forward``) and ``searchsorted`` have no ONNX
translation. Distances are written as eager computes them without matrix products: the
p-norm of every pair's difference (``p`` = 0 counts differing coordinates, ``inf`` takes the
largest). ``searchsorted`` is eager's binary search, unrolled: its step count is bounded by the
static length of the sorted axis, and each step gathers the middle element of every search
interval, so even a sequence with NaN (where a count of smaller elements would differ from a
search) gives eager's positions.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["DISTANCE_DECOMPOSITIONS"]

_aten = torch.ops.aten


def _norm_of_differences(diff: torch.Tensor, p: float) -> torch.Tensor:
    """The ``p``-norm over the last dim of ``diff`` (eager's distance kernels' cases)."""
    if p == 0:
        return (diff != 0).to(diff.dtype).sum(-1)
    a = diff.abs()
    if p == 1:
        return a.sum(-1)
    if p == 2:
        return (a * a).sum(-1).sqrt()
    if math.isinf(p):
        return a.amax(-1)
    return a.pow(p).sum(-1).pow(1.0 / p)


def cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> Any:
    """``_cdist_forward``: the distance of every row of ``x1`` to every row of ``x2``, batched;
    eager's matrix-product form for p = 2 where its ``compute_mode`` picks it."""
    if not x1.is_floating_point() or x1.dtype != x2.dtype or p < 0:
        return NotImplemented
    r1, r2, m = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    if r1 == 0 or r2 == 0 or m == 0:
        return NotImplemented
    mode = 0 if compute_mode is None else compute_mode
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        return NotImplemented  # the product form: eager's cdist takes another path (autograd through it)
    wide = torch.float32 if x1.dtype in (torch.float16, torch.bfloat16) else x1.dtype
    diff = x1.to(wide).unsqueeze(-2) - x2.to(wide).unsqueeze(-3)
    return _norm_of_differences(diff, p).to(x1.dtype)


def pdist_forward(x: torch.Tensor, p: float = 2.0) -> Any:
    """``_pdist_forward``: distances of the row pairs ``i < j`` of a matrix, row-major."""
    if not x.is_floating_point() or x.dim() != 2 or p < 0:
        return NotImplemented
    n = x.shape[0]
    if n < 2:
        return x.new_zeros(0)
    wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    first, second = torch.triu_indices(n, n, 1, device=x.device)
    w = x.to(wide)
    diff = w.index_select(0, first) - w.index_select(0, second)
    return _norm_of_differences(diff, p).to(x.dtype)


def searchsorted(
    sorted_sequence: torch.Tensor,
    values: torch.Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: torch.Tensor | None = None,
) -> Any:
    """``searchsorted`` as eager's binary search with a static number of steps."""
    if sorted_sequence.is_complex() or values.is_complex() or sorted_sequence.dtype == torch.bool:
        return NotImplemented
    right = right or side == "right"
    n = sorted_sequence.shape[-1]
    out_dtype = torch.int32 if out_int32 else torch.int64
    seq = sorted_sequence
    if sorter is not None:
        seq = torch.gather(seq, -1, sorter)
    if n == 0 or values.numel() == 0:
        return torch.zeros(values.shape, dtype=out_dtype, device=values.device)
    common = torch.promote_types(seq.dtype, values.dtype)
    if common in (torch.float16, torch.bfloat16):
        common = torch.float32
    seq, vals = seq.to(common), values.to(common)
    flat_seq = seq.dim() == 1
    if not flat_seq and seq.shape[:-1] != vals.shape[:-1]:
        return NotImplemented
    lo = torch.zeros(vals.shape, dtype=torch.int64, device=vals.device)
    hi = torch.full(vals.shape, n, dtype=torch.int64, device=vals.device)
    for _ in range(n.bit_length()):
        active = lo < hi
        mid = lo + torch.div(hi - lo, 2, rounding_mode="floor")
        safe = mid.clamp_max(n - 1)
        middle = seq[safe] if flat_seq else torch.gather(seq, -1, safe)
        # eager's predicates: left !(middle >= value), right !(middle > value)
        below = ~(middle > vals) if right else ~(middle >= vals)
        lo = torch.where(active & below, mid + 1, lo)
        hi = torch.where(active & ~below, mid, hi)
    return lo.to(out_dtype)


#: distances and sorted search (op -> decomposition)
DISTANCE_DECOMPOSITIONS: dict[Any, Any] = {
    _aten._cdist_forward.default: cdist_forward,
    _aten._pdist_forward.default: pdist_forward,
    _aten.searchsorted.Tensor: searchsorted,
}

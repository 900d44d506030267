"""Order statistics (``kthvalue``, ``median``, ``nanmedian``) by ranks ORT computes.

These ops have no ONNX translation. The k-th smallest element of a row is the one whose rank is
``k - 1``, the rank of element ``i`` being the number of elements before it in the order: smaller
ones, and equal ones at smaller positions (NaN after every number, equal to NaN, as eager sorts).
Ranks take ``n`` comparisons per element, so rows are ranked this way up to
:data:`MAX_COMPARISONS` comparisons in all; larger inputs stay in PyTorch.

Eager's NaN rules are kept: ``median`` of a row with a NaN is NaN at its first NaN, ``nanmedian``
ranks only the numbers (NaN at the first position when there are none). Which of several equal
elements gives the index is not defined by eager (nor the same on every device); here it is
the first one in the rank order.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ORDER_DECOMPOSITIONS", "MAX_COMPARISONS"]

_aten = torch.ops.aten

#: the most element comparisons (elements x row length) ranked on ORT
MAX_COMPARISONS = 1 << 24


def _rankable(x: Any, dim: int) -> bool:
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.dtype == torch.bool or x.numel() == 0:
        return False
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        return False
    n = x.shape[dim] if x.dim() else 1
    return x.numel() * n <= MAX_COMPARISONS


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """The rank of every element of the last dim among its row (int64)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # compared exactly in float32
    n = x.shape[-1]
    mine, other = x.unsqueeze(-1), x.unsqueeze(-2)  # [..., i, j]: element i against element j
    position = torch.arange(n, device=x.device)
    earlier = position.unsqueeze(-1) > position  # j before i
    if x.is_floating_point():
        nan_mine, nan_other = torch.isnan(mine), torch.isnan(other)
        less = (other < mine) | (nan_mine & ~nan_other)
        equal = (other == mine) | (nan_mine & nan_other)
    else:
        less, equal = other < mine, other == mine
    return (less | (equal & earlier)).sum(-1)


def _select(x: torch.Tensor, rank: torch.Tensor, k: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Value and index of the element of rank ``k`` (an int or per-row int64) of every row."""
    hit = rank == (k.unsqueeze(-1) if isinstance(k, torch.Tensor) else k)
    index = torch.argmax(hit.to(torch.int32), -1)
    return torch.gather(x, -1, index.unsqueeze(-1)).squeeze(-1), index


def _by_rows(fn: Any) -> Any:
    """``fn(rows) -> (values, indices)`` over the last dim, for ``dim`` of any tensor: the dim
    moved last and back, 0-d tensors as one-element rows, ``keepdim`` applied."""

    def decompose(x: torch.Tensor, dim: int, keepdim: bool, *args: Any) -> Any:
        rows = x.reshape(1) if x.dim() == 0 else x.movedim(dim, -1)
        values, indices = fn(rows, *args)
        if x.dim() == 0:
            return values.reshape(()), indices.reshape(())
        if keepdim:
            values, indices = values.unsqueeze(-1).movedim(-1, dim), indices.unsqueeze(-1).movedim(-1, dim)
        return values, indices

    return decompose


def _kth(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _select(rows, _ranks(rows), k - 1)


def _median(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = _select(rows, _ranks(rows), (rows.shape[-1] - 1) // 2)
    if not rows.is_floating_point():
        return values, indices
    nan = torch.isnan(rows)
    any_nan = nan.any(-1)
    first_nan = torch.argmax(nan.to(torch.int32), -1)
    return torch.where(any_nan, torch.full_like(values, float("nan")), values), torch.where(any_nan, first_nan, indices)


def _nanmedian(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not rows.is_floating_point():
        return _median(rows)
    count = (~torch.isnan(rows)).sum(-1)
    k = torch.div((count - 1).clamp_min(0), 2, rounding_mode="floor")
    return _select(rows, _ranks(rows), k)


_kth_rows = _by_rows(_kth)
_median_rows = _by_rows(_median)
_nanmedian_rows = _by_rows(_nanmedian)


def kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> Any:
    """``kthvalue``: the element of rank ``k - 1`` along ``dim``."""
    if not _rankable(x, dim) or not 1 <= k <= (x.shape[dim] if x.dim() else 1):
        return NotImplemented
    return _kth_rows(x, dim, keepdim, k)


def _dim_op(rows_fn: Any) -> Any:
    def decompose(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
        if not _rankable(x, dim):
            return NotImplemented
        return rows_fn(x, dim, keepdim)

    return decompose


def _whole_op(rows_fn: Any) -> Any:
    def decompose(x: torch.Tensor) -> Any:
        if not _rankable(x.reshape(-1), 0):
            return NotImplemented
        return rows_fn(x.reshape(-1), 0, False)[0]

    return decompose


#: order statistics by ranks (op -> decomposition)
ORDER_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.kthvalue.default: kthvalue,
    _aten.median.dim: _dim_op(_median_rows),
    _aten.median.default: _whole_op(_median_rows),
    _aten.nanmedian.dim: _dim_op(_nanmedian_rows),
    _aten.nanmedian.default: _whole_op(_nanmedian_rows),
}

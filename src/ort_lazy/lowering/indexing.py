"""Indexed reductions and writes in terms of the scatters ORT runs.

``index_reduce`` and ``put`` have no ONNX translation, and torchlib's ``scatter_reduce`` with
``reduce="mean"`` is wrong. All three are rewritten into ``scatter_reduce`` (ONNX
``ScatterElements`` with a reduction), ``scatter_add`` and ``index_put`` with eager's semantics:
a mean divides by the number of values reduced into each position (the position's own value
counted when ``include_self``), integers by floor division, positions nothing is reduced into
keep their value.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _compat
from .guards import _once

__all__ = ["INDEXING_DECOMPOSITIONS", "in_layout_of"]

_aten = torch.ops.aten


def _scatter_mean(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, include_self: bool) -> torch.Tensor:
    total = torch.scatter_reduce(self, dim, index, src, "sum", include_self=include_self)
    start = torch.ones_like(self) if include_self else torch.zeros_like(self)
    count = torch.scatter_add(start, dim, index, torch.ones_like(src))
    count = torch.where(count == 0, torch.ones_like(count), count)
    if self.is_floating_point():
        return total / count
    return torch.div(total, count, rounding_mode="floor")


def _scatter_extreme(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, include_self: bool) -> torch.Tensor:
    """``amax``/``amin`` of floats with eager's NaN and infinities. ORT's ScatterElements max/min
    drops a NaN already in the data (``[NaN]`` max-reduced with 5 gave 5), and the translation
    without ``include_self`` starts from the largest finite value, not infinity (a min of
    ``inf`` gave 3.4e38). Here the reduction always includes its start: ``self``, or where
    something is reduced into without it, the reduction's identity (-inf for max, inf for min);
    a NaN among the values reduced into a position makes it NaN."""
    start = self
    if not include_self:
        hits = torch.scatter_add(torch.zeros_like(self), dim, index, torch.ones_like(src)) > 0
        start = torch.where(hits, torch.full_like(self, -math.inf if reduce == "amax" else math.inf), self)
    out = _aten.scatter_reduce.two(start, dim, index, src, reduce, include_self=True)
    nan = torch.scatter_add(torch.zeros_like(self), dim, index, torch.isnan(src).to(self.dtype)) > 0
    nan = nan | torch.isnan(start)
    return torch.where(nan, torch.full_like(out, math.nan), out)


def _scatter_reduce(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *, include_self: bool = True) -> Any:
    """``scatter_reduce``: ``mean`` as a sum over a count, float ``amax``/``amin`` with eager's NaN
    and infinities; the others as they are."""
    if self.is_complex() or self.dtype == torch.bool:
        return NotImplemented
    if reduce == "mean":
        return _scatter_mean(self, dim, index, src, include_self)
    if reduce in ("amax", "amin") and self.is_floating_point():
        return _scatter_extreme(self, dim, index, src, reduce, include_self)
    return NotImplemented


scatter_reduce = _once(_aten.scatter_reduce, _scatter_reduce)


def index_reduce(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str, *, include_self: bool = True) -> Any:
    """``index_reduce`` as ``scatter_reduce`` with the index spread over ``source``'s shape
    (0-d tensors as 1-element vectors)."""
    if self.is_complex() or self.dtype == torch.bool or self.dim() != source.dim():
        return NotImplemented
    if self.dim() == 0:
        out = index_reduce(self.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce, include_self=include_self)
        return out.reshape(())
    dim = dim % source.dim()
    shape = [1] * source.dim()
    shape[dim] = -1
    spread = index.reshape(shape).expand(source.shape)
    if reduce == "mean":
        return _scatter_mean(self, dim, spread, source, include_self)
    return torch.scatter_reduce(self, dim, spread, source, reduce, include_self=include_self)


def put(self: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> Any:
    """``put`` (``self`` seen as 1-D, negative indices from the end) as ``index_put``."""
    if self.is_complex():
        return NotImplemented
    flat = self.reshape(-1)
    where = index.reshape(-1)
    where = torch.where(where < 0, where + flat.numel(), where)
    out = flat.index_put((where,), source.reshape(-1), accumulate).reshape(self.shape)
    return in_layout_of(out, self)  # eager's result keeps self's strides


def in_layout_of(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``out`` (contiguous, ``like``'s shape) in the dense layout of ``like`` (a permuted one), as
    the eager op it stands for returns it: a traced graph with other strides than eager's fails
    to trace views that eager's allow. Contiguous and other layouts come back unchanged."""
    if like.is_contiguous() or not _compat.dense_layout(like):
        return out
    order = sorted(range(like.dim()), key=lambda d: (-like.stride(d), d))  # outermost first
    return out.permute(order).contiguous().permute([order.index(d) for d in range(like.dim())])


#: indexed reductions and writes as scatters (op -> decomposition)
INDEXING_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.scatter_reduce.two: scatter_reduce,
    _aten.index_reduce.default: index_reduce,
    _aten.put.default: put,
}

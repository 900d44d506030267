"""Cumulative ops as parallel prefix scans of ops ORT runs.

``cumprod``, ``cummax``, ``cummin`` and ``logcumsumexp`` have no ONNX operator (ONNX has only
``CumSum``) and torchlib either lacks them or, for ``logcumsumexp``, subtracts the whole axis'
maximum, so entries far below a later maximum underflow. Each is written here as an
inclusive scan in ``ceil(log2(n))`` steps (Hillis and Steele): step ``s`` combines every element
with the running result ``2**s`` positions before it. The combining function is associative,
so the result is the sequential one; only the grouping of a product or log-sum differs, within
rounding. Integer products wrap exactly as eager's do (multiplication modulo 2**bits is
associative). The axis length is static in every graph compiled here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SCAN_DECOMPOSITIONS", "scan"]

_aten = torch.ops.aten

Combine = Callable[[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]


def scan(parts: tuple[torch.Tensor, ...], dim: int, combine: Combine) -> tuple[torch.Tensor, ...]:
    """The inclusive scan of ``parts`` (tensors of one shape) along ``dim`` under ``combine``
    (associative; called as ``combine(earlier, later)``)."""
    n = parts[0].shape[dim]
    shift = 1
    while shift < n:
        earlier = tuple(p.narrow(dim, 0, n - shift) for p in parts)
        later = tuple(p.narrow(dim, shift, n - shift) for p in parts)
        merged = combine(earlier, later)
        parts = tuple(torch.cat([p.narrow(dim, 0, shift), m], dim) for p, m in zip(parts, merged))
        shift *= 2
    return parts


def _scannable(x: Any, dim: int) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() > 0 and x.numel() > 0 and -x.dim() <= dim < x.dim()


def cumprod(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> Any:
    """``cumprod`` as a product scan, in ``dtype`` (eager's promotion: integers and bool to int64)."""
    if not _scannable(x, dim):
        return NotImplemented
    if dtype is None:
        dtype = torch.int64 if not x.is_floating_point() and not x.is_complex() else x.dtype
    if dtype.is_complex:
        return NotImplemented
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    (out,) = scan((x.to(wide),), dim, lambda a, b: (a[0] * b[0],))
    return out.to(dtype)


def _extreme(larger: bool) -> Callable[..., Any]:
    """``cummax`` (``larger``) / ``cummin``: values and the index of the last extreme so far,
    NaN counting as the extreme (eager's rule: an element replaces the running one when it is
    ``>=`` / ``<=`` it or is NaN)."""

    def decompose(x: torch.Tensor, dim: int) -> Any:
        if not _scannable(x, dim) or x.dtype == torch.bool:
            return NotImplemented
        dim = dim % x.dim()
        shape = [1] * x.dim()
        shape[dim] = x.shape[dim]
        index = torch.arange(x.shape[dim], device=x.device).reshape(shape).expand(x.shape)
        floating = x.is_floating_point()

        def combine(earlier: tuple[torch.Tensor, ...], later: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            (v0, i0), (v1, i1) = earlier, later
            take = v1 >= v0 if larger else v1 <= v0
            if floating:
                take = take | torch.isnan(v1)
            return torch.where(take, v1, v0), torch.where(take, i1, i0)

        values, indices = scan((x, index), dim, combine)
        return values, indices

    return decompose


def logcumsumexp(x: torch.Tensor, dim: int) -> Any:
    """``logcumsumexp`` as a log-add scan: each step adds two running sums, each relative to its
    own maximum, so no entry underflows below a later, larger one (half types in float32)."""
    if not _scannable(x, dim) or not x.is_floating_point():
        return NotImplemented
    wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    # logaddexp is itself decomposed (exponentials.logaddexp): accurate, equal infinities kept
    (out,) = scan((x.to(wide),), dim, lambda a, b: (torch.logaddexp(a[0], b[0]),))
    return out.to(x.dtype)


#: cumulative ops as scans (op -> decomposition)
SCAN_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.cumprod.default: cumprod,
    _aten.cummax.default: _extreme(larger=True),
    _aten.cummin.default: _extreme(larger=False),
    _aten.logcumsumexp.default: logcumsumexp,
}

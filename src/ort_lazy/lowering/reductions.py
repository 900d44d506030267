"""Reductions with eager's results where ORT's reduce kernels give others.

* ``amax``/``amin``, ``max``/``min`` (whole, or along a dim) and ``argmax``/``argmin`` of floats
  propagate NaN as eager does (ORT's ReduceMax/ArgMax skip it); a reduction of a 0-d tensor is
  the tensor itself (the exporter's translations are ill-typed there);
* int64 / int32 ``sum`` and ``prod`` in integer arithmetic (ORT accumulates int64 in double);
* ``mean`` with a ``dtype`` converts first; ``linalg_vector_norm`` keeps eager's precision and
  NaN rule; ``prims.var`` (every ``var``/``std``) reads the data shifted by its first element.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _compat
from .common import _aten
from .guards import _once

__all__ = ["REDUCTION_DECOMPOSITIONS"]


def _reduce_scalar(op: Any) -> Any:
    """A reduction of a 0-d tensor is the tensor itself (as bool for any/all): the exporter's
    translations of amax/amin/any/all are ill-typed for 0-d inputs."""

    def decompose(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if x.dim() != 0:
            return NotImplemented
        if op in (_aten.any, _aten.all):
            return x != 0 if x.dtype != torch.bool else x.clone()
        return x.clone()

    return decompose


def _nan_propagating(op: Any, kind: str) -> Any:
    """``amax``/``amin`` (``kind`` "values"), ``max.dim``/``min.dim`` ("both"), ``argmax``/
    ``argmin`` ("indices") of floats with eager's NaN rule: a NaN in the reduced elements is the
    result, its first position the index. ORT's ReduceMax/ArgMax skip NaN (a row [inf, NaN]
    gave inf where eager gives NaN). 0-d inputs go to :func:`_reduce_scalar`'s rule."""
    scalar = _reduce_scalar(op) if kind == "values" else None

    def decompose(x: torch.Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        if scalar is not None and x.dim() == 0:
            return scalar(x, dim, keepdim)
        if kind == "both" and x.dtype == torch.bool and dim is not None:
            # ORT has no bool ArgMax/ReduceMax: the same in int32
            values, indices = op(x.to(torch.int32), dim, keepdim)
            return values.to(torch.bool), indices
        if not x.is_floating_point() or x.dim() == 0:
            return NotImplemented
        if kind == "indices" and dim is None:
            if keepdim:
                return NotImplemented
            x, dim = x.reshape(-1), 0
        dims = [dim] if isinstance(dim, int) else list(dim) if dim not in (None, []) else list(range(x.dim()))
        nan = torch.isnan(x)
        any_nan = nan.any(dim=tuple(dims), keepdim=keepdim)
        # no dims spelt out as every dim: the translation of amax(x) with none fails to export
        out = op(x, dims if kind == "values" else dim, keepdim)
        if kind == "values":
            return torch.where(any_nan, torch.full_like(out, math.nan), out)
        first_nan = torch.argmax(nan.to(torch.uint8), dims[0], keepdim)
        if kind == "indices":
            return torch.where(any_nan, first_nan, out)
        values, indices = out
        return torch.where(any_nan, torch.full_like(values, math.nan), values), torch.where(any_nan, first_nan, indices)

    return _once(op, decompose)


def _whole(op: Any) -> Any:
    """``max()``/``min()`` of a whole tensor: ``amax``/``amin`` over every dim (NaN rule above)."""
    reduce = _nan_propagating(op, "values")

    def decompose(x: torch.Tensor) -> Any:
        if x.dtype == torch.bool:
            return op(x.to(torch.int32), list(range(x.dim()))).to(torch.bool)  # no bool ReduceMax in ORT
        if not x.is_floating_point():
            return NotImplemented
        return reduce(x, list(range(x.dim())), False)

    return decompose


def _reduced_dims(x: torch.Tensor, dim: Any) -> list[int]:
    """The dims a reduction's ``dim`` argument names, non-negative: every dim for None or an
    empty list, else ``dim`` (an int or a sequence) in its order."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    return [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]


def vector_norm(x: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """``linalg_vector_norm`` where the exporter's translation loses precision:

    * float16 / bfloat16: computed in float32 and rounded once, as eager's kernel accumulates
      (per-op float16 steps overflow: ``|x|**6`` of 8.5 is inf in float16);
    * float64 with an ord other than 0, 1, 2, +-inf: ``sum(|x|**ord) ** (1/ord)`` in aten ops,
      whose float exponents are kept exact (the translation's ``1/ord`` is a float32 constant:
      2e-7 relative error);
    * ord +-inf: ``amax`` / ``amin`` of ``|x|``, which propagate NaN as eager does (the
      translation's ReduceMax skips a NaN: the largest of the other elements where eager gives
      NaN).
    """
    if dtype is not None:
        return NotImplemented
    if x.dtype in (torch.float16, torch.bfloat16):
        return _aten.linalg_vector_norm.default(x.float(), ord, dim, keepdim).to(x.dtype)
    dims = _reduced_dims(x, dim)
    if x.is_floating_point() and ord in (math.inf, -math.inf):
        return x.abs().amax(dims, keepdim) if ord > 0 else x.abs().amin(dims, keepdim)
    if x.dtype == torch.float64 and isinstance(ord, (int, float)) and ord not in (0, 1, 2, math.inf, -math.inf):
        total = x.abs().pow(float(ord)).sum(dims, keepdim=keepdim)
        return total.pow(1.0 / float(ord))
    return NotImplemented


def mean_in_dtype(op: Any) -> Any:
    """``mean(x, ..., dtype=d)`` with ``x`` cast to ``d`` first, as eager computes it. The
    exporter averaged in ``x``'s own type and cast the result: an integer tensor's mean came
    out truncated (0.8 as 0.0), a float16 mean lost float32's digits."""

    def mean(x: torch.Tensor, *args: Any, dtype: Any = None) -> Any:
        if dtype is None or dtype == x.dtype:
            return NotImplemented
        return op(x.to(dtype), *args)

    return mean


_INTEGRAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)


def _reduced_last(x: torch.Tensor, dim: Any, keepdim: bool) -> tuple[torch.Tensor, list[int]] | None:
    """``x`` with the reduced dimensions moved last and flattened into one, and the result's
    shape; None when the sizes are symbolic."""
    if not all(isinstance(n, int) for n in x.shape):
        return None
    rank = x.dim()
    if rank == 0:
        return x.reshape(1), []
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        dims = list(range(rank))
    else:
        dims = sorted({d % max(rank, 1) for d in ([dim] if isinstance(dim, int) else dim)})
    kept = [d for d in range(rank) if d not in dims]
    shape = [1 if d in dims else x.shape[d] for d in range(rank)] if keepdim else [x.shape[d] for d in kept]
    flat = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1)
    return flat, shape


def integer_sum(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """int64 / int32 ``sum`` as the last element of a cumulative sum: ORT's ReduceSum accumulates int64 in
    double (onnxruntime 1.32: ``2**53 + 1`` sums to ``2**53``, overflow saturates where eager
    wraps); its CumSum is exact."""
    out = dtype or torch.int64
    if x.dtype not in _INTEGRAL or out not in (torch.int64, torch.int32):
        return NotImplemented
    moved = _reduced_last(x.to(out), dim, keepdim)
    if moved is None:
        return NotImplemented
    flat, shape = moved
    if flat.shape[-1] == 0:
        return torch.zeros(shape, dtype=out, device=x.device)
    return flat.cumsum(-1, dtype=out).select(-1, -1).reshape(shape)


def integer_prod(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """int64 / int32 ``prod`` as a tree of products of halves: ORT's ReduceProd multiplies int64 in double
    (wrong beyond 2**53). Products modulo 2**64 in any order equal eager's."""
    out = dtype or torch.int64
    if x.dtype not in _INTEGRAL or out not in (torch.int64, torch.int32):
        return NotImplemented
    moved = _reduced_last(x.to(out), dim, keepdim)
    if moved is None:
        return NotImplemented
    flat, shape = moved
    if flat.shape[-1] == 0:
        return torch.ones(shape, dtype=out, device=x.device)
    while flat.shape[-1] > 1:
        n = flat.shape[-1]
        if n % 2:
            flat = torch.cat([flat, torch.ones_like(flat[..., :1])], -1)
            n += 1
        flat = flat[..., : n // 2] * flat[..., n // 2 :]
    return flat.select(-1, 0).reshape(shape)


def _prod_dim(x: torch.Tensor, dim: int, keepdim: bool = False, *, dtype: Any = None) -> Any:
    return integer_prod(x, [dim], keepdim, dtype=dtype)


def shifted_variance(x: torch.Tensor, dims: Any, correction: float, *, output_dtype: Any = None) -> Any:
    """``prims.var`` (every ``var``/``std``/``var_mean``) of floats as two passes over the data
    shifted by its first element along ``dims``: the translation subtracts the mean, which in
    float32 is only as exact as a float32 sum, so data far from 0 against its spread lost
    digits (``1e4 + 0.01 * randn``: 1e-3 relative, where eager accumulates in double), and a
    constant float64 column of 3e38 had variance 1.7e45 for 0. Shifted, the differences are
    exact where values are close (Sterbenz) and a constant column is 0 exactly. Static sizes
    only (the translation keeps the others); divides by ``max(0, N - correction)`` as eager."""
    if not x.is_floating_point() or output_dtype is not None or x.dim() == 0:
        return NotImplemented
    dims = _reduced_dims(x, dims)
    sizes = [_compat.static_int(x.shape[d]) for d in dims]
    if None in sizes:
        return NotImplemented
    count = math.prod(sizes)
    if count == 0:
        return NotImplemented
    pivot = x
    for d in dims:
        pivot = pivot.narrow(d, 0, 1)
    shifted = x - pivot
    deviation = shifted - shifted.mean(dims, keepdim=True)
    return (deviation * deviation).sum(dims) / max(0.0, count - correction)


#: reductions with eager's NaN rules, integer arithmetic and precision (op -> decomposition)
REDUCTION_DECOMPOSITIONS: dict[Any, Any] = {
    **{op.default: _nan_propagating(op, "values") for op in (_aten.amax, _aten.amin)},
    **{op.dim: _nan_propagating(op, "both") for op in (_aten.max, _aten.min)},
    _aten.max.default: _whole(_aten.amax),
    _aten.min.default: _whole(_aten.amin),
    **{op.default: _nan_propagating(op, "indices") for op in (_aten.argmax, _aten.argmin)},
    **{getattr(op, o): _reduce_scalar(op) for op in (_aten.any, _aten.all) for o in ("default", "dim", "dims")},
    _aten.linalg_vector_norm.default: vector_norm,
    torch.ops.prims.var.default: shifted_variance,
    _aten.mean.default: mean_in_dtype(_aten.mean.default),
    _aten.mean.dim: mean_in_dtype(_aten.mean.dim),
    _aten.sum.default: integer_sum,
    _aten.sum.dim_IntList: integer_sum,
    _aten.prod.default: integer_prod,
    _aten.prod.dim_int: _prod_dim,
}

"""Scaled matrix products, multiply-adds and interpolation with eager's precision.

* ``addmm``, ``addmv``, ``addbmm``, ``baddbmm`` and ``addr``: ``beta=0`` ignores ``self`` (its
  NaN and inf are not propagated), and float64 ``alpha``/``beta`` that float32 cannot hold stay
  float64 (the translation's Gemm holds them in float32 attributes);
* ``addcmul``/``addcdiv`` of float64 with their ``value`` in float64, of float16 / bfloat16 in
  float32, rounded once;
* ``lerp`` with the side of eager's two-sided form picked while tracing (the translation
  computes both sides and selects), float16 / bfloat16 in float32;
* ``prims.fma`` as a product and a sum (:func:`fma`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..support import float32_exact
from .common import _HALF, _aten, _in_float32

__all__ = ["PRODUCT_DECOMPOSITIONS", "fma"]


def _scaled_product(product_of: Any) -> Any:
    """``addmm``, ``addmv``, ``addbmm``, ``baddbmm``, ``addr`` (``beta * self + alpha *
    product``) of floats where the translation is wrong: ``beta=0`` ignores ``self`` in eager
    (NaN and inf in it are not propagated; the translation multiplied them by 0: NaN), and
    float64 ``alpha``/``beta`` that float32 cannot hold are products in float64 (the
    translation's Gemm holds them in float32 attributes: 1e-8 to 2e-7 off)."""

    def decompose(self: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
        if (
            not isinstance(self, torch.Tensor)
            or not self.is_floating_point()
            or not isinstance(beta, (int, float))
            or not isinstance(alpha, (int, float))
        ):
            return NotImplemented
        inexact = self.dtype == torch.float64 and not (float32_exact(float(beta)) and float32_exact(float(alpha)))
        if beta != 0 and not inexact:
            return NotImplemented
        product = product_of(a, b)
        if alpha != 1:
            product = product * alpha
        if beta == 0:
            return product
        return self * beta + product

    decompose.__doc__ = _scaled_product.__doc__
    return decompose


def _pointwise_with_value(divide: bool) -> Any:
    halves = _in_float32(_aten.addcdiv.default if divide else _aten.addcmul.default)

    def decompose(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, *, value: Any = 1) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in _HALF:
            return halves(x, t1, t2, value=value)
        if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in (x, t1, t2)):
            return NotImplemented
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return NotImplemented
        scaled = t1 * float(value)
        return x + (scaled / t2 if divide else scaled * t2)

    decompose.__doc__ = f"``addc{'div' if divide else 'mul'}`` of float64 with its ``value`` in float64."
    return decompose


def lerp_scalar(start: torch.Tensor, end: torch.Tensor, weight: float) -> Any:
    """``lerp`` with a Python weight, in eager's two-sided form with the side picked while
    tracing: the exporter's translation computes both sides for every element and selects with
    ``Where`` (a quarter of an Adam step's ORT time), and holds the weight as a float32 constant
    in float64. float32 and float64, which eager computes in their own precision; float16 and
    bfloat16 in float32, rounded once, as eager (step by step in float16, ``end - start``
    overflowed: inf where eager gives -45856)."""
    if not isinstance(end, torch.Tensor) or not isinstance(weight, (int, float)):
        return NotImplemented
    if end.dtype in _HALF and start.dtype == end.dtype:
        return lerp_scalar(start.float(), end.float(), weight).to(end.dtype)
    if end.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    diff = end - start
    return start + diff * float(weight) if abs(weight) < 0.5 else end - diff * (1.0 - float(weight))


def fma(a: Any, b: Any, c: Any) -> Any:
    """``prims.fma`` (``a * b + c``, which an optimizer's step calls) as a product and a sum:
    ONNX has no fused multiply-add, so the sum rounds once more (within an ulp of eager's)."""
    return a * b + c


#: scaled products, multiply-adds and interpolation (op -> decomposition)
PRODUCT_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.addmm.default: _scaled_product(torch.mm),
    _aten.addmv.default: _scaled_product(torch.mv),
    _aten.addbmm.default: _scaled_product(lambda a, b: torch.bmm(a, b).sum(0)),
    _aten.baddbmm.default: _scaled_product(torch.bmm),
    _aten.addr.default: _scaled_product(torch.outer),
    _aten.addcmul.default: _pointwise_with_value(divide=False),
    _aten.addcdiv.default: _pointwise_with_value(divide=True),
    _aten.lerp.Scalar: lerp_scalar,
    _aten.lerp.Tensor: _in_float32(_aten.lerp.Tensor),
}

"""Comparisons, clamps and value tests with eager's rules for NaN and infinity.

``fmax``/``fmin`` give the other operand where one is NaN (ONNX has no NaN-ignoring Max/Min),
``clamp`` by one bound keeps infinities (ONNX's ``Clip`` without a bound clips at the dtype's
largest finite value in ORT), ``isnan`` of integers is all False (ONNX's IsNaN takes floats
only) and ``isinf`` of float64 is a comparison (the translation casts to float32 first, where
1e300 is infinite).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import _aten

__all__ = ["COMPARISON_DECOMPOSITIONS"]


def nan_ignoring(op: Any) -> Any:
    """``fmax`` / ``fmin`` (``op``: ``maximum`` / ``minimum``) as a select around ``op``: a NaN in
    one operand gives the other, as eager does (ONNX has no NaN-ignoring Max/Min). Integers and
    bool hold no NaN: ``op`` itself."""

    def decompose(a: torch.Tensor, b: torch.Tensor) -> Any:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return NotImplemented
        both = op(a, b)
        if not both.is_floating_point():
            return both
        a, b = a.to(both.dtype), b.to(both.dtype)
        return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, both))

    return decompose


def clamp_scalars(x: torch.Tensor, min: Any = None, max: Any = None) -> Any:
    """``clamp`` of floats by one Python bound, the other given as infinity: the translation is
    ONNX ``Clip`` without it, which ORT takes as the dtype's largest finite value, so
    ``inf.clamp(min=0.5)`` gave 3.4e38 (and ``F.normalize`` of an infinite row a number where
    eager gives NaN)."""
    if not x.is_floating_point() or (min is None) == (max is None):
        return NotImplemented
    # both bounds Python floats: an int beside the float infinity matches no translation
    low = -math.inf if min is None else float(min) if isinstance(min, (int, float)) else min
    high = math.inf if max is None else float(max) if isinstance(max, (int, float)) else max
    return torch.clamp(x, low, high)


def one_sided_clamp(side: str) -> Any:
    """``clamp_min``/``clamp_max`` of floats as ``clamp`` with that one bound (the translation
    clips at the dtype's largest finite value, see :func:`clamp_scalars`)."""

    def decompose(x: torch.Tensor, bound: Any) -> Any:
        if not x.is_floating_point():
            return NotImplemented
        return torch.clamp(x, min=bound) if side == "min" else torch.clamp(x, max=bound)

    return decompose


def isnan_of_integers(x: torch.Tensor) -> Any:
    """``isnan`` of an integer or bool tensor: all False (ONNX's IsNaN takes floats only)."""
    if x.is_floating_point() or x.is_complex():
        return NotImplemented
    return torch.zeros_like(x, dtype=torch.bool)


def infinity_test(kind: str) -> Any:
    """``isinf`` / ``isposinf`` / ``isneginf`` of float64 as comparisons: the exporter's
    translation casts to float32 first, so 1e300 reads as infinite."""

    def decompose(x: torch.Tensor) -> Any:
        if x.dtype != torch.float64:
            return NotImplemented
        if kind == "pos":
            return x == math.inf
        if kind == "neg":
            return x == -math.inf
        return x.abs() == math.inf

    return decompose


#: comparisons, clamps and value tests (op -> decomposition)
COMPARISON_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.fmax.default: nan_ignoring(torch.maximum),
    _aten.fmin.default: nan_ignoring(torch.minimum),
    _aten.clamp.default: clamp_scalars,
    **{getattr(_aten.clamp_min, o): one_sided_clamp("min") for o in ("default", "Tensor")},
    **{getattr(_aten.clamp_max, o): one_sided_clamp("max") for o in ("default", "Tensor")},
    _aten.isnan.default: isnan_of_integers,
    _aten.isinf.default: infinity_test("any"),
    _aten.isposinf.default: infinity_test("pos"),
    _aten.isneginf.default: infinity_test("neg"),
}

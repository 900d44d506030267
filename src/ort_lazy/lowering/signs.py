"""Signs and sign bits with eager's rules for NaN and -0.0.

ONNX before opset 26 has no bit cast: a float's sign bit is read from comparisons, negative or a
zero whose reciprocal is negative (:func:`_sign_bit`). ``signbit`` is then true for -0.0 too,
``copysign`` multiplies by +1 or -1 by it (ORT's Where drops the sign of a -0.0 taken from its
first branch), and ``sign``/``sgn`` of floats are 0 for NaN as in eager (ONNX's Sign gives NaN).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import _aten, _torch_decomposition

__all__ = ["SIGN_DECOMPOSITIONS", "copysign"]


def _sign_bit(x: torch.Tensor) -> torch.Tensor:
    """The sign bit of a float tensor from comparisons: negative, or a zero whose reciprocal is
    negative (-0.0). ONNX before opset 26 has no bit cast, so a NaN reads as positive."""
    return (x < 0) | ((x == 0) & (torch.reciprocal(x) < 0))


def signbit(x: torch.Tensor) -> Any:
    """``signbit`` of floats true for -0.0 too (the translation, ``x < 0``, misses it)."""
    if not x.is_floating_point():
        return NotImplemented
    return _sign_bit(x)


def copysign(a: Any, b: Any) -> Any:
    """``copysign`` as ``|a|`` times +1 or -1 from the sign bit of ``b`` (-0.0 negative, as in eager).

    torch's reference decomposes to ``prims.signbit``, which has no ONNX mapping (and whose
    fake kernel says float where the real one says bool). A product, not a select: ORT's Where
    turns a -0.0 taken from its first branch into +0.0 (``runtime/quirks.py``).
    """
    if not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    magnitude = a.to(dtype).abs()
    if not isinstance(b, torch.Tensor):
        return -magnitude if math.copysign(1.0, float(b)) < 0 else magnitude
    return magnitude * (1 - 2 * _sign_bit(b.to(dtype)).to(dtype))


def float_sign(x: torch.Tensor) -> Any:
    """``sign`` of floats as eager computes it, ``(x > 0) - (x < 0)``: 0 for NaN (ONNX's Sign
    gives NaN)."""
    if not x.is_floating_point():
        return NotImplemented
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


def real_sgn(x: torch.Tensor) -> Any:
    """``sgn``: :func:`float_sign` for floats, torch's own decomposition otherwise (this entry
    replaces it in the table, so declining would leave ``sgn`` untranslated)."""
    if x.is_floating_point():
        return float_sign(x)
    return _torch_decomposition(_aten.sgn.default, x)


#: signs and sign bits (op -> decomposition)
SIGN_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.sign.default: float_sign,
    _aten.sgn.default: real_sgn,
    _aten.signbit.default: signbit,
    _aten.copysign.Tensor: copysign,
    _aten.copysign.Scalar: copysign,
}

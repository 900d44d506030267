"""Arithmetic by eager's exact algorithms: division, remainders, powers, numbers on the left.

* a Python number on the left of a binary op (``1.0 - mask``, ``3 // x``, ``2.5 % x``) becomes a
  0-d tensor of the type eager computes in, so that the rewrites here and the translation apply
  (:func:`_number_on_the_left`);
* integer division in integer arithmetic (the translation divides in float32), floating
  ``floor_divide`` and ``remainder`` by eager's algorithms (``fmod``, then a correction by the
  signs), float64 ``fmod`` by a number with the divisor in float64;
* powers of integers as products (ORT's integer ``Pow`` goes through floating point), powers by
  the exponents eager's kernel computes without ``std::pow`` as it computes them, and powers
  whose base has another dtype than the result with the base cast first;
* ``add``/``sub`` of float16 / bfloat16 with an ``alpha`` in float32, rounded once; ``trunc``,
  ``floor``, ``ceil`` and ``round`` of integers as the values themselves.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import _aten, _in_float32

__all__ = ["ARITHMETIC_DECOMPOSITIONS", "integer_power", "scalar_power"]


def _left_number(number: Any, other: torch.Tensor) -> torch.Tensor:
    """A Python number on the left of a binary op as the 0-d tensor of the type eager computes
    the op in (``torch.result_type``: the number is a weak operand)."""
    return torch.scalar_tensor(number, dtype=torch.result_type(number, other), device=other.device)


def _number_on_the_left(op: Any, rewrite: Any = None) -> Any:
    """``op`` with a Python number as ``self`` (``1.0 - mask`` decomposes to ``sub.Tensor(1.0,
    mask)``, ``3 // x`` is ``floor_divide(3, x)``, ``2.5 % x`` is ``remainder.Scalar_Tensor``)
    called again with that number as :func:`_left_number`'s tensor, so the rewrites that expect
    a tensor there and the translation apply: the exporter has no overload for a number there
    (such ops ran in PyTorch), and ``remainder`` / ``floor_divide`` of a number missed eager's
    exact algorithms (``1e300 % x`` in float64 gave 0, ``1e300 // x`` in float16 inf for NaN).
    Other calls go to ``rewrite`` (or stay as they are)."""

    def decompose(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor) and isinstance(a, (bool, int, float)):
            return op(_left_number(a, b), b, *args, **kwargs)
        return NotImplemented if rewrite is None else rewrite(a, b, *args, **kwargs)

    return decompose


def integer_division(a: torch.Tensor, b: Any, rounding_mode: str | None = None) -> Any:
    """``div`` of integers with ``rounding_mode`` "floor" / "trunc" in integer arithmetic: the
    exporter's translation divides in float32, wrong from 2**24 (``123456789 // 7`` off by 2).
    Floor is ``floor_divide``; trunc adds 1 back where the signs differ and a remainder is left."""
    if rounding_mode not in ("floor", "trunc") or not isinstance(a, torch.Tensor):
        return NotImplemented
    if not isinstance(b, torch.Tensor):
        if not isinstance(b, int) or isinstance(b, bool):
            return NotImplemented
        b = torch.scalar_tensor(b, dtype=a.dtype, device=a.device)
    if a.is_floating_point() or b.is_floating_point() or a.dtype == torch.bool or b.dtype == torch.bool:
        return NotImplemented
    q = torch.floor_divide(a, b)
    if rounding_mode == "floor":
        return q
    inexact = (q * b) != a
    return torch.where(inexact & ((a < 0) != (b < 0)), q + 1, q)


def float_floor_divide(a: Any, b: Any) -> Any:
    """Floating ``floor_divide`` / ``div(rounding_mode="floor")`` by eager's algorithm: the
    quotient of ``a - fmod(a, b)``, corrected by the remainder's sign and rounded to nearest.
    The translation's ``floor(a / b)`` gave inf for ``inf // 1`` (eager and Python: NaN) and
    rounds the quotient first. float16/bfloat16 compute in float32."""
    if not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    work = torch.float64 if dtype == torch.float64 else torch.float32
    a = a.to(work)
    b = b.to(work) if isinstance(b, torch.Tensor) else torch.full_like(a, float(b))
    mod = torch.fmod(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    quotient = a / b
    zero = torch.zeros_like(quotient) * torch.where(quotient < 0, -1.0, 1.0)  # copysign(0, a / b)
    out = torch.where(div == 0, zero, floor)
    return torch.where(b == 0, quotient, out).to(dtype)


def floor_division_mode(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    """``div`` with a rounding mode: integers by :func:`integer_division`, float "floor" by
    :func:`float_floor_divide`."""
    out = integer_division(a, b, rounding_mode)
    if out is NotImplemented and rounding_mode == "floor":
        return float_floor_divide(a, b)
    return out


def fmod_scalar(x: torch.Tensor, other: Any) -> Any:
    """``fmod`` of float64 by a Python number, the divisor as a float64 tensor."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float64 or not isinstance(other, (int, float)):
        return NotImplemented
    return torch.fmod(x, torch.full_like(x, float(other)))


def float_remainder(a: Any, b: Any) -> Any:
    """Floating ``remainder`` as eager computes it: ``fmod`` (exact), plus ``b`` where the signs
    differ. The translation's ``a - b * floor(a / b)`` rounds the quotient: ``remainder(3.3, 0.3)``
    gave 0.0 where eager gives 0.29999999999999993."""
    if not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    b = b.to(dtype) if isinstance(b, torch.Tensor) else torch.full_like(a, float(b), dtype=dtype)
    mod = torch.fmod(a.to(dtype), b)
    return torch.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def promoted_power(x: torch.Tensor, exponent: Any) -> Any:
    """``pow`` of tensors whose base has another dtype than the result (an integer base, a
    float16 exponent) with the base cast first: ONNX ``Pow`` gives its base's type, and ORT
    refused the session of the whole region."""
    dtype = torch.result_type(x, exponent)
    if x.dtype == dtype:
        return NotImplemented
    return torch.pow(x.to(dtype), exponent)


def integer_power(x: torch.Tensor, exponent: Any) -> Any:
    """``x ** k`` of an integer or bool tensor and a constant ``k >= 0`` as products (square and
    multiply): exact, and wrapping on overflow as PyTorch's kernel does (products modulo
    2**bits do not depend on their order). ORT's integer ``Pow`` goes through floating point
    (see :func:`ort_lazy.support.rules._integer_power`)."""
    if x.dtype.is_floating_point or x.dtype.is_complex or not isinstance(exponent, int) or exponent < 0:
        return NotImplemented
    x = x.to(torch.result_type(x, exponent))  # bool ** k is an int64 power
    if exponent == 0:
        return torch.ones_like(x)
    result, base, k = None, x, int(exponent)
    while k:
        if k & 1:
            result = base if result is None else result * base
        k >>= 1
        if k:
            base = base * base
    assert result is not None
    return result.clone() if result is x else result


#: exponents eager's CPU ``pow`` computes without ``std::pow`` (float32, float64, bfloat16)
_POWERS: dict[float, Any] = {
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    0.5: torch.sqrt,
    -0.5: lambda x: 1.0 / torch.sqrt(x),
    -1.0: lambda x: 1.0 / x,
    -2.0: lambda x: 1.0 / (x * x),
}


def scalar_power(x: torch.Tensor, exponent: Any) -> Any:
    """``x ** k`` for a Python number ``k``: integer bases by :func:`integer_power`; float32,
    float64 and bfloat16 bases with ``k`` in (2, 3, 0.5, -0.5, -1, -2) as eager's kernel computes
    them (products, ``sqrt``, a division), where ORT's ``Pow`` went through ``std::pow``: 20-30x
    slower than the products (1.5 ms against 50 us for 262144 floats) and unlike eager at the
    edges (``(-inf) ** 0.5`` inf where eager gives NaN, ``(-0.0) ** 0.5`` +0.0)."""
    if not x.is_floating_point():
        return integer_power(x, exponent)
    if x.dtype not in (torch.float32, torch.float64, torch.bfloat16) or isinstance(exponent, bool):
        return NotImplemented
    if not isinstance(exponent, (int, float)) or float(exponent) not in _POWERS:
        return NotImplemented
    if x.dtype == torch.bfloat16 and exponent == -0.5:  # eager's rsqrt: in float32, rounded once
        return _POWERS[-0.5](x.float()).to(x.dtype)
    return _POWERS[float(exponent)](x)


def round_integers(x: torch.Tensor) -> Any:
    """``trunc``/``floor``/``ceil``/``round`` of integers: the values themselves (ONNX's Floor and
    friends take floats only)."""
    if x.is_floating_point() or x.is_complex():
        return NotImplemented
    return x.clone()


#: arithmetic (op -> decomposition)
ARITHMETIC_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.add.Tensor: _in_float32(_aten.add.Tensor, ("alpha",)),
    _aten.sub.Tensor: _number_on_the_left(_aten.sub.Tensor, _in_float32(_aten.sub.Tensor, ("alpha",))),
    _aten.div.Tensor_mode: floor_division_mode,
    _aten.div.Scalar_mode: floor_division_mode,
    _aten.floor_divide.default: _number_on_the_left(_aten.floor_divide.default, float_floor_divide),
    _aten.floor_divide.Scalar: float_floor_divide,
    _aten.fmod.Scalar: fmod_scalar,
    _aten.remainder.Scalar: float_remainder,
    _aten.remainder.Tensor: float_remainder,
    _aten.remainder.Scalar_Tensor: _number_on_the_left(_aten.remainder.Tensor),
    _aten.bitwise_left_shift.Scalar_Tensor: _number_on_the_left(_aten.bitwise_left_shift.Tensor),
    _aten.bitwise_right_shift.Scalar_Tensor: _number_on_the_left(_aten.bitwise_right_shift.Tensor),
    _aten.pow.Tensor_Scalar: scalar_power,
    _aten.pow.Tensor_Tensor: promoted_power,
    **{op.default: round_integers for op in (_aten.trunc, _aten.floor, _aten.ceil, _aten.round)},
}

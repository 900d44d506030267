"""Angles and trigonometric functions with C's special values and float64 constants.

``atan2`` with C's quadrants, zeros and infinities (read from the sign bits, :mod:`.signs`),
``hypot`` without intermediate overflow or underflow, ``angle`` of real numbers (NaN for NaN),
and float64 ``deg2rad``, ``rad2deg`` and ``sinc`` with float64 constants (float16 / bfloat16
``sinc`` in float32, rounded once).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import _HALF, _aten, _float64_only
from .signs import _sign_bit

__all__ = ["TRIGONOMETRY_DECOMPOSITIONS"]


def atan2(y: Any, x: Any) -> Any:
    """``atan2`` with C's quadrants, zeros and infinities: ``atan(y / x)``, plus or minus pi
    where ``x``'s sign bit is set (-0.0 included), both infinities apart.

    The exporter's translation gave -pi for ``atan2(0.0, -5.0)`` (eager: pi, the phase of a
    negative real number), -pi/2 for ``atan2(1, -0.0)`` and 0 for ``atan2(inf, inf)``.
    float16 / bfloat16 compute in float32 (eager's kernels do); float64 has no ORT Atan kernel.
    """
    if not (isinstance(y, torch.Tensor) and isinstance(x, torch.Tensor)):
        return NotImplemented
    dtype = torch.result_type(y, x)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype == torch.float64:
        return NotImplemented
    y, x = y.to(torch.float32), x.to(torch.float32)
    neg_x, neg_y = _sign_bit(x), _sign_bit(y)
    y_sign = 1 - 2 * neg_y.to(torch.float32)  # +1 / -1 by y's sign bit
    half_turn = y_sign * math.pi
    # both zeros: atan(+-0 / 1) is +-0, then +-pi where x is -0.0, as C's atan2
    both_zero = (x == 0) & (y == 0)
    q = torch.atan(y / torch.where(both_zero, torch.ones_like(x), x))
    # Where keeps a -0.0 only from its second branch (quirks.WHERE_DROPS_NEGATIVE_ZERO): the
    # value that can be -0.0 (q) stays there
    r = torch.where(neg_x, q + half_turn, q)
    both_inf = torch.isinf(x) & torch.isinf(y)
    r = torch.where(both_inf, y_sign * torch.where(neg_x, 0.75 * math.pi, 0.25 * math.pi), r)
    return r.to(dtype)


def hypot(a: torch.Tensor, b: torch.Tensor) -> Any:
    """``hypot`` without intermediate overflow or underflow, as eager's libm kernel computes it.

    float32 and narrower: ``sqrt(a*a + b*b)`` in float64 (no overflow or underflow for their
    range) rounded once. float64: scaled by ``m = max(|a|, |b|)``: ``m * sqrt((a/m)**2 + (b/m)**2)``,
    0 where both are 0, inf where either is infinite (even beside a NaN, as C's hypot).
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    if dtype != torch.float64:
        wa, wb = a.to(torch.float64).abs(), b.to(torch.float64).abs()
        out = torch.sqrt(wa * wa + wb * wb)
    else:
        wa, wb = a.to(dtype).abs(), b.to(dtype).abs()
        m = torch.maximum(wa, wb)
        safe = torch.where(m == 0, torch.ones_like(m), m)
        qa, qb = wa / safe, wb / safe
        out = m * torch.sqrt(qa * qa + qb * qb)
    out = torch.where((wa == math.inf) | (wb == math.inf), torch.full_like(out, math.inf), out)
    return out.to(dtype)


def real_angle(x: torch.Tensor) -> Any:
    """``angle`` of real numbers: pi below 0, 0 otherwise, NaN for NaN (the translation gave 0)."""
    if x.is_complex():
        return NotImplemented
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    x = x.to(dtype)
    return torch.where(torch.isnan(x), x, torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x)))


@_float64_only
def deg2rad(x: torch.Tensor) -> Any:
    """``x * (pi / 180)`` with a float64 constant."""
    return x * (math.pi / 180.0)


@_float64_only
def rad2deg(x: torch.Tensor) -> Any:
    """``x * (180 / pi)`` with a float64 constant."""
    return x * (180.0 / math.pi)


def sinc(x: torch.Tensor) -> Any:
    """``sin(pi x) / (pi x)``, 1 at 0: float64 with a float64 pi, float16 / bfloat16 in float32
    rounded once as eager's kernel (the translation's steps in float16 were 5000 steps off
    near the roots); float32 keeps the translation."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float64, *_HALF):
        return NotImplemented
    xf = x.float() if x.dtype in _HALF else x
    product = xf * math.pi
    return torch.where(xf != 0, torch.sin(product) / product, torch.ones_like(xf)).to(x.dtype)


#: angles and trigonometric functions (op -> decomposition)
TRIGONOMETRY_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.atan2.default: atan2,
    _aten.hypot.default: hypot,
    _aten.angle.default: real_angle,
    _aten.deg2rad.default: deg2rad,
    _aten.rad2deg.default: rad2deg,
    _aten.sinc.default: sinc,
}

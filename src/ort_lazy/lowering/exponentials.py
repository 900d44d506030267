"""Exponentials and logarithms accurate where the exporter's forms lose digits.

``log1p`` and ``expm1`` stay accurate for small arguments (the exporter's ``Log(1 + x)`` and
``Exp(x) - 1`` are 0 below the dtype's epsilon), ``logaddexp``/``logaddexp2`` build on that
``log1p``, float64 ``log2``/``log10`` divide by float64 constants, and ``xlogy`` follows eager's
order of its NaN and zero rules. float16 / bfloat16 compute in float32, rounded once.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import _HALF, _aten, _float64_only

__all__ = ["EXPONENTIAL_DECOMPOSITIONS", "expm1", "log1p", "logaddexp", "logaddexp2"]


def _accurate_log1p(x: torch.Tensor) -> torch.Tensor:
    u = 1 + x
    d = u - 1
    # log(u) * x / (u - 1) cancels the rounding of 1 + x (Goldberg); exact where 1 + x rounds to 1
    # x goes in Where's second branch: ORT's Where drops the sign of a -0.0 from its first
    body = torch.where(d != 0, torch.log(u) * (x / torch.where(d == 0, torch.ones_like(d), d)), x)
    return torch.where(x == math.inf, x, body)


def log1p(x: torch.Tensor) -> Any:
    """``log1p`` accurate for small ``x`` in float32 / float64: the exporter's ``Log(1 + x)`` is 0
    for ``|x|`` below the dtype's epsilon (``log1p(1e-10)`` gave 0 in float32). float16 /
    bfloat16 in float32, rounded once."""
    if x.dtype in _HALF:
        return _accurate_log1p(x.float()).to(x.dtype)
    if x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return _accurate_log1p(x)


def expm1(x: torch.Tensor) -> Any:
    """``expm1`` accurate for small ``x`` in float32 / float64 (the exporter's ``Exp(x) - 1``
    is 0 below the dtype's epsilon): ``(e**x - 1) * x / log(e**x)`` for ``|x| < 1`` (Kahan).
    float16 / bfloat16 in float32, rounded once, as eager's kernels compute them."""
    if x.dtype in _HALF:
        return expm1(x.float()).to(x.dtype)
    if x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    u = torch.exp(x)
    small = torch.abs(x) < 1
    logu = torch.where(small & (u != 1), torch.log(u), torch.ones_like(u))
    body = torch.where(small, (u - 1) * x / logu, u - 1)
    return torch.where(u != 1, body, x)  # x second: keeps -0.0 (quirks.WHERE_DROPS_NEGATIVE_ZERO)


def _log_add(exp: Any, ln_base: float) -> Any:
    """``logaddexp`` (``exp``, ln e = 1) and ``logaddexp2`` (``exp2``, ln 2) as
    ``max + log1p(exp(-|a - b|)) / ln base`` with :func:`log1p`'s accuracy (the exporter's form
    loses results below epsilon: ``logaddexp(-100, 0)`` and ``logaddexp2(0, -88)`` gave 0, and
    ``logaddexp2(0, 3e38)`` overflowed), equal infinities kept. float16 / bfloat16 in float32,
    rounded once as eager's kernels (``logaddexp(0, -5.66)`` was 12% off in float16, 0 in
    bfloat16)."""

    def decompose(a: torch.Tensor, b: torch.Tensor) -> Any:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return NotImplemented
        dtype = torch.result_type(a, b)
        if dtype in _HALF:
            return decompose(a.to(torch.float32), b.to(torch.float32)).to(dtype)
        if dtype not in (torch.float32, torch.float64):
            return NotImplemented
        a, b = a.to(dtype), b.to(dtype)
        m = torch.maximum(a, b)
        same_inf = torch.isinf(a) & (a == b)
        correction = _accurate_log1p(exp(-torch.abs(a - b)))
        if ln_base != 1.0:
            correction = correction / ln_base
        return torch.where(same_inf, a, m + correction)

    return decompose


logaddexp = _log_add(torch.exp, 1.0)


logaddexp2 = _log_add(torch.exp2, math.log(2.0))


@_float64_only
def log2(x: torch.Tensor) -> Any:
    """``log(x) / log(2)`` with a float64 constant."""
    return torch.log(x) / math.log(2.0)


@_float64_only
def log10(x: torch.Tensor) -> Any:
    """``log(x) / log(10)`` with a float64 constant."""
    return torch.log(x) / math.log(10.0)


def xlogy(x: Any, y: Any) -> Any:
    """``xlogy`` with eager's order of rules: NaN where ``y`` is NaN (even where ``x`` is 0), then
    0 where ``x`` is 0, else ``x * log(y)``."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return NotImplemented
    dtype = torch.result_type(x, y)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x, y = x.to(dtype), y.to(dtype)
    product = torch.where(x == 0, torch.zeros_like(x * y), x * torch.log(y))
    return torch.where(torch.isnan(y), y.expand_as(product), product)


#: exponentials and logarithms (op -> decomposition)
EXPONENTIAL_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.log1p.default: log1p,
    _aten.expm1.default: expm1,
    _aten.logaddexp.default: logaddexp,
    _aten.logaddexp2.default: logaddexp2,
    _aten.log2.default: log2,
    _aten.log10.default: log10,
    _aten.xlogy.Tensor: xlogy,
}

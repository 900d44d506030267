"""PyTorch's special functions written with elementwise ops the exporter translates.

ONNX has no Bessel, gamma-family or inverse-error functions, so without these the ops below stay
in PyTorch (the graph reaches ``prims.bessel_i0``, ``prims.digamma`` ...). Each decomposition
follows the algorithm of PyTorch's CPU kernel (the same expansions, branch points and special
values) so that results agree with eager to rounding:

- I0/I1 (``i0``, ``special.i0e/i1/i1e``, ``special.modified_bessel_i0/i1``) and K0/K1
  (``special.modified_bessel_k0/k1``, ``special.scaled_modified_bessel_k0/k1``): Cephes'
  Chebyshev expansions on [0, 8] (resp. [0, 2]) and in 1/x beyond;
- ``digamma`` (recurrence to x >= 10, asymptotic series, reflection for x < 0), ``polygamma``
  (n = 1: trigamma's recurrence; n >= 2: ``(-1)^(n+1) n! zeta(n+1, x)``) and ``special.zeta``
  (Hurwitz zeta: direct sum, then Euler-Maclaurin);
- ``lgamma``: Lanczos' approximation (g = 7, 9 terms) with the reflection formula;
- ``special.ndtri``: Cephes' three rational approximations;
- ``erfinv``: a rational first guess and two Newton steps;
- ``special.erfcx``: a Chebyshev expansion of ``(1 + 2x) erfcx(x)`` in ``(x - 3.75) / (x + 3.75)``
  for x >= 0 and ``2 exp(x^2) - erfcx(-x)`` below; ``erfc`` as ``exp(-x^2) erfcx(x)`` past 1/2 (the
  translation's ``1 - erf`` is 0 past 3.9 in float32), a Taylor series of ``erf`` within; float64
  ``erf`` (ORT has no double kernel) from the same two;
- ``special.bessel_j0/j1/y0/y1``: Cephes' rational approximations on [0, 5] and Hankel's
  modulus/phase form beyond; ``special.spherical_bessel_j0``: sin(x) / x (Taylor series below
  1/2); ``special.airy_ai``: Maclaurin series on (-2.09, 2.09) and Cephes' asymptotic forms
  outside. Their sines and cosines take the argument eager takes (in the input's dtype), reduced
  in float64 (see :func:`_cos_sin`).

Every branch of a piecewise function is computed on the whole tensor and the results are selected
with ``where``; special values (poles, domain ends, infinities) are selected last. Float16 and
bfloat16 inputs are computed in float32 and rounded once, as eager does; integer and bool inputs
are promoted to the default float dtype. Where eager's CPU kernel accumulates in double for
float32 (``zeta``, and thereby ``polygamma`` for n >= 2), so does the decomposition; ``lgamma``,
``erfinv`` and ``erfcx`` of float32 are also computed in float64 (ORT has no float64 ``Erf``, so
``erfinv`` uses its own error function built on ``erfcx``).

The coefficient tables and constants of these expansions are in
:mod:`~ort_lazy.lowering.special_coefficients`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .special_coefficients import (
    _AIRY_AD,
    _AIRY_AFD,
    _AIRY_AFN,
    _AIRY_AGD,
    _AIRY_AGN,
    _AIRY_AN,
    _AIRY_C1,
    _AIRY_C2,
    _DIGAMMA_A,
    _ERF_TAYLOR,
    _ERFCX_C,
    _ERFCX_K,
    _ERFINV_A,
    _ERFINV_B,
    _ERFINV_C,
    _ERFINV_D,
    _EXP_M2,
    _HALF_LOG_2PI,
    _I0_A,
    _I0_B,
    _I1_A,
    _I1_B,
    _INV_SQRT_PI,
    _INV_SQRT_PI_AIRY,
    _J0_R1,
    _J0_R2,
    _J0_RP,
    _J0_RQ,
    _J1_R1,
    _J1_R2,
    _J1_RP,
    _J1_RQ,
    _K0_A,
    _K0_B,
    _K1_A,
    _K1_B,
    _LANCZOS,
    _LANCZOS_G,
    _NDTRI_P0,
    _NDTRI_P1,
    _NDTRI_P2,
    _NDTRI_Q0,
    _NDTRI_Q1,
    _NDTRI_Q2,
    _PI_PARTS,
    _PP0,
    _PP1,
    _PQ0,
    _PQ1,
    _PSI_10,
    _QP0,
    _QP1,
    _QQ0,
    _QQ1,
    _QUARTER_PI,
    _SINC_TAYLOR,
    _SQRT_2PI,
    _SQRT_TWO_OVER_PI,
    _THREE_QUARTER_PI,
    _TWO_OVER_PI,
    _Y0_YP,
    _Y0_YQ,
    _Y1_YP,
    _Y1_YQ,
    _ZETA_A,
)

__all__ = ["SPECIAL_DECOMPOSITIONS", "ZETA_MIN_Q"]

Tensor = torch.Tensor
_aten = torch.ops.aten

_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# -- evaluation helpers ------------------------------------------------------------------------------


def _chbevl(y: Tensor, coefficients: Sequence[float]) -> Tensor:
    """Chebyshev series sum in Cephes' convention: ``0.5 * (b0 - b2)`` of the recurrence
    ``b0 = y * b1 - b2 + c`` over the coefficients, highest order first."""
    b1: Any = coefficients[0]
    b0 = y * coefficients[0] + coefficients[1]
    b2: Any = 0.0
    for c in coefficients[2:]:
        b2 = b1
        b1 = b0
        b0 = y * b1 - b2 + c
    return (b0 - b2) * 0.5


def _polevl(x: Tensor, coefficients: Sequence[float]) -> Tensor:
    """Polynomial with the given coefficients, highest power first (Horner)."""
    r = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        r = r * x + c
    return r


def _clenshaw(y: Tensor, coefficients: Sequence[float]) -> Tensor:
    """``sum(c[k] * T_k(y))`` for Chebyshev polynomials ``T_k``, lowest order first."""
    two_y = y * 2.0
    b1: Any = 0.0
    b2: Any = 0.0
    for c in reversed(coefficients[1:]):
        b1, b2 = two_y * b1 - b2 + c, b1
    return y * b1 - b2 + coefficients[0]


def _full(like: Tensor, value: float) -> Tensor:
    return torch.full_like(like, value)


def _where(cond: Tensor, value: float | Tensor, other: Tensor) -> Tensor:
    """``where`` whose first choice may be a Python number (then a tensor like ``other``)."""
    if not isinstance(value, Tensor):
        value = _full(other, value)
    return torch.where(cond, value, other)


def _dtypes(x: Tensor, wide: bool = False, half: bool = True) -> tuple[torch.dtype, torch.dtype] | None:
    """(dtype to compute in, result dtype) for ``x``, or None for dtypes not handled.

    Half types compute in float32 (None unless ``half``: eager has no kernel for them); integers
    and bool give the default float dtype; ``wide`` computes float32 in float64."""
    if x.is_complex():
        return None
    out = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    if out not in _FLOATS or (out in _HALF and not half):
        return None
    work = torch.float32 if out in _HALF else out
    if wide and out == torch.float32:
        work = torch.float64
    return work, out


def _unary(
    impl: Callable[[Tensor], Tensor], wide: bool = False, half: bool = True
) -> Callable[[Tensor], Any]:
    """Decomposition of a unary op computed by ``impl`` in the working dtype (see :func:`_dtypes`)."""

    def decompose(x: Tensor) -> Any:
        dtypes = _dtypes(x, wide, half)
        if dtypes is None:
            return NotImplemented
        work, out = dtypes
        return impl(x.to(work)).to(out)

    decompose.__doc__ = impl.__doc__
    return decompose


def _reduce_pi(a: Tensor) -> Tensor:
    """``a - n pi`` (float64) for the integer n nearest to ``a / pi``: sin and cos of the result
    are those of ``a`` up to the sign ``(-1)^n``, accurate also where ``a`` is close to a
    multiple of pi (ORT's own reduction is not)."""
    n = torch.round(a * (1.0 / math.pi))
    for part in _PI_PARTS:
        a = a - n * part
    return a


# -- modified Bessel functions of the first kind (I0, I1) -------------------------------------------


def _i0e_parts(ax: Tensor) -> tuple[Tensor, Tensor]:
    """exp(-x) I0(x) for x = ``ax`` >= 0 as (series on [0, 8], series beyond / sqrt(x))."""
    return _chbevl(ax * 0.5 - 2.0, _I0_A), _chbevl(32.0 / ax - 2.0, _I0_B)


def _i0(x: Tensor) -> Tensor:
    """Modified Bessel function of the first kind, order 0."""
    ax = x.abs()
    small, large = _i0e_parts(ax)
    e = torch.exp(ax)
    return torch.where(ax <= 8.0, e * small, e * large / torch.sqrt(ax))


def _i0e(x: Tensor) -> Tensor:
    """Exponentially scaled modified Bessel function of the first kind, order 0."""
    ax = x.abs()
    small, large = _i0e_parts(ax)
    return torch.where(ax <= 8.0, small, large / torch.sqrt(ax))


def _signed(x: Tensor, magnitude: Tensor) -> Tensor:
    return torch.where(x < 0.0, -magnitude, magnitude)


def _i1(x: Tensor) -> Tensor:
    """Modified Bessel function of the first kind, order 1."""
    ax = x.abs()
    e = torch.exp(ax)
    small = e * ax * _chbevl(ax * 0.5 - 2.0, _I1_A)
    large = e * _chbevl(32.0 / ax - 2.0, _I1_B) / torch.sqrt(ax)
    return _signed(x, torch.where(ax <= 8.0, small, large))


def _i1e(x: Tensor) -> Tensor:
    """Exponentially scaled modified Bessel function of the first kind, order 1."""
    ax = x.abs()
    small = _chbevl(ax * 0.5 - 2.0, _I1_A) * ax
    large = _chbevl(32.0 / ax - 2.0, _I1_B) / torch.sqrt(ax)
    return _signed(x, torch.where(ax <= 8.0, small, large))


# -- modified Bessel functions of the second kind (K0, K1) ------------------------------------------


def _k_domain(x: Tensor, value: Tensor) -> Tensor:
    """K0/K1's special values: +inf at 0, NaN for x < 0."""
    return _where(x == 0.0, math.inf, _where(x < 0.0, math.nan, value))


def _k0_small(x: Tensor) -> Tensor:
    return _chbevl(x * x - 2.0, _K0_A) - torch.log(x * 0.5) * _i0(x)


def _k1_small(x: Tensor) -> Tensor:
    return torch.log(x * 0.5) * _i1(x) + _chbevl(x * x - 2.0, _K1_A) / x


def _k0(x: Tensor) -> Tensor:
    """Modified Bessel function of the second kind, order 0."""
    large = torch.exp(-x) * _chbevl(8.0 / x - 2.0, _K0_B) / torch.sqrt(x)
    return _k_domain(x, torch.where(x <= 2.0, _k0_small(x), large))


def _k1(x: Tensor) -> Tensor:
    """Modified Bessel function of the second kind, order 1."""
    large = torch.exp(-x) * _chbevl(8.0 / x - 2.0, _K1_B) / torch.sqrt(x)
    return _k_domain(x, torch.where(x <= 2.0, _k1_small(x), large))


def _k0e(x: Tensor) -> Tensor:
    """Exponentially scaled modified Bessel function of the second kind, order 0."""
    large = _chbevl(8.0 / x - 2.0, _K0_B) / torch.sqrt(x)
    return _k_domain(x, torch.where(x <= 2.0, _k0_small(x) * torch.exp(x), large))


def _k1e(x: Tensor) -> Tensor:
    """Exponentially scaled modified Bessel function of the second kind, order 1."""
    large = _chbevl(8.0 / x - 2.0, _K1_B) / torch.sqrt(x)
    return _k_domain(x, torch.where(x <= 2.0, _k1_small(x) * torch.exp(x), large))


# -- digamma, trigamma, Hurwitz zeta, polygamma -----------------------------------------------------


def _digamma_positive(x: Tensor) -> Tensor:
    """digamma for x > 0 (and the recurrence's values elsewhere): steps up to x >= 10, then the
    asymptotic series (exact value at 10)."""
    result = torch.zeros_like(x)
    z = x
    for _ in range(10):
        below = z < 10.0
        result = torch.where(below, result - torch.reciprocal(z), result)
        z = torch.where(below, z + 1.0, z)
    w = torch.reciprocal(z * z)
    series = _where(z < 1.0e17, w * _polevl(w, _DIGAMMA_A), torch.zeros_like(z))
    asymptotic = result + torch.log(z) - 0.5 / z - series
    return torch.where(z == 10.0, result + _PSI_10, asymptotic)


def _digamma(x: Tensor) -> Tensor:
    """Digamma (psi) function: the logarithmic derivative of the gamma function."""
    negative = x < 0.0
    value = _digamma_positive(torch.where(negative, 1.0 - x, x))
    # pi / tan(pi r) for the fractional part r, in float64 as eager computes it
    xd = x.to(torch.float64)
    reduced = _reduce_pi((xd - torch.trunc(xd)) * math.pi)
    reflected = value - (torch.cos(reduced) * math.pi / torch.sin(reduced)).to(x.dtype)
    result = torch.where(negative, reflected, value)
    result = _where(negative & (x == torch.trunc(x)), math.nan, result)
    # +-0: -inf for +0, +inf for -0 (the sign of -1 / x)
    return torch.where(x == 0.0, -torch.reciprocal(x), result)


def _trigamma(x: Tensor) -> Tensor:
    """Trigamma function (polygamma of order 1)."""
    small = x < 0.5
    s = torch.sin(_reduce_pi(x * math.pi) if x.dtype == torch.float64 else x * math.pi)
    result = _where(small, -(math.pi * math.pi) / (s * s), torch.zeros_like(x))
    z = torch.where(small, 1.0 - x, x)
    for _ in range(6):
        result = result + torch.reciprocal(z * z)
        z = z + 1.0
    ixx = torch.reciprocal(z * z)
    tail = (1.0 + 0.5 / z + ixx * (1.0 / 6.0 - ixx * (1.0 / 30.0 - ixx * (1.0 / 42.0)))) / z
    result = result + tail
    return torch.where(small, -result, result)


#: Cephes' MACHEP (2**-53, float64's unit roundoff): where eager's sums stop
_MACHEP = 1.11022302462515654042e-16
#: terms of zeta's direct sum before the Euler-Maclaurin tail (eager takes at least 9 and goes on
#: while the base is <= 9, so the sum is eager's for q >= :data:`ZETA_MIN_Q`)
_ZETA_TERMS = 40
#: the smallest q for which :func:`_zeta` sums as many terms as eager (exact for q > this)
ZETA_MIN_Q = 10.0 - _ZETA_TERMS


def _zeta(x: Tensor, q: Tensor) -> Tensor:
    """Hurwitz zeta function sum((k + q)^-x, k >= 0): eager's direct sum (ending early once a term
    is below machine epsilon relative to the sum) followed by the Euler-Maclaurin correction;
    the poles and domain rules are :func:`_hurwitz_zeta`'s."""
    s = torch.pow(q, -x)
    a = q
    b = torch.zeros_like(s)
    done = torch.zeros_like(s, dtype=torch.bool)
    for i in range(_ZETA_TERMS):
        a_next = a + 1.0
        b_next = torch.pow(a_next, -x)
        s_next = s + b_next
        active = ~done if i < 9 else ~done & (a <= 9.0)
        converged = (b_next > s_next * -_MACHEP) & (b_next < s_next * _MACHEP)
        a = torch.where(active, a_next, a)
        b = torch.where(active, b_next, b)
        s = torch.where(active, s_next, s)
        done = done | (active & converged)
    w = a
    tail = s + b * w / (x - 1.0)
    tail = tail - b * 0.5
    factor = torch.ones_like(s)
    finished = done
    k = 0.0
    for divisor in _ZETA_A:
        factor = factor * (x + k)
        b = b / w
        t = factor * b / divisor
        updated = tail + t
        tail = torch.where(finished, tail, updated)
        finished = finished | ((t / updated).abs() < _MACHEP)
        k += 1.0
        factor = factor * (x + k)
        b = b / w
        k += 1.0
    return torch.where(done, s, tail)


def _hurwitz_zeta(x: Tensor, q: Tensor) -> Tensor:
    """:func:`_zeta` for every q. Below :data:`ZETA_MIN_Q` eager's direct sum takes one term per
    unit of distance (the unrolled sum would stop short: ``zeta(2, -5659000.5)`` gave -1.8e-7
    where eager gives pi^2); there, with r = q - floor(q) and an integer x (other x give NaN), the
    terms at negative bases are ``(-1)^x`` times those of ``zeta(x, 1 - r)`` below ``1 - q``:
    ``zeta(x, q) = (-1)^x (zeta(x, 1 - r) - zeta(x, 1 - q)) + zeta(x, r)``, all three of positive
    arguments, evaluated in one stacked call."""
    x, q = torch.broadcast_tensors(x, q)
    far = (q < ZETA_MIN_Q) & torch.isfinite(x)
    r = q - torch.floor(q)
    z = _zeta(torch.stack([x, x, x]), torch.stack([torch.where(far, r, q), 1.0 - r, 1.0 - q]))
    sign = torch.where(x - 2.0 * torch.floor(x * 0.5) == 0.0, 1.0, -1.0)
    reflected = sign * (z[1] - z[2]) + z[0]
    # x = inf: a base within 1 of 0 makes a term infinite, as eager's sum finds
    result = _where((x == math.inf) & (q < 0.0), math.inf, torch.where(far, reflected, z[0]))
    q_pole = (q <= 0.0) & (q == torch.floor(q))
    q_nan = (q <= 0.0) & (x != torch.floor(x))
    result = _where(q_pole, math.inf, _where(q_nan, math.nan, result))
    return _where(x == 1.0, math.inf, _where(x < 1.0, math.nan, result))


def _zeta_decomposition(x: Any, q: Any) -> Any:
    """``special_zeta(x, q)`` of two real tensors (accumulated in float64 for float32, as eager)."""
    if not (isinstance(x, Tensor) and isinstance(q, Tensor)):
        return NotImplemented
    if x.is_complex() or q.is_complex():
        return NotImplemented
    out = torch.result_type(x, q)
    if not out.is_floating_point:
        out = torch.get_default_dtype()
    if out not in (torch.float32, torch.float64):
        return NotImplemented
    work = torch.float64
    return _hurwitz_zeta(x.to(work), q.to(work)).to(out)


def _polygamma_decomposition(n: int, x: Tensor) -> Any:
    """``polygamma(n, x)``: digamma (n = 0), trigamma (n = 1), ``(-1)^(n+1) n! zeta(n+1, x)``."""
    dtypes = _dtypes(x)
    if dtypes is None or not isinstance(n, int) or n < 0:
        return NotImplemented
    work, out = dtypes
    x = x.to(work)
    if n == 0:
        return _digamma(x).to(out)
    if n == 1:
        return _trigamma(x).to(out)
    accumulate = torch.float64 if work == torch.float32 else work
    xa = x.to(accumulate)
    z = _hurwitz_zeta(torch.full_like(xa, float(n + 1)), xa).to(work)
    sign = 1.0 if n % 2 else -1.0
    return (z * (sign * float(math.factorial(n)))).to(out)


# -- lgamma ------------------------------------------------------------------------------------------


def _lgamma_lanczos(x: Tensor) -> Tensor:
    """log(gamma(x)) for x >= 1/2 by Lanczos' approximation of gamma(z + 1), z = x - 1."""
    z = x - 1.0
    series = torch.reciprocal(z + 1.0) * _LANCZOS[1] + _LANCZOS[0]
    for k, c in enumerate(_LANCZOS[2:], start=2):
        series = series + torch.reciprocal(z + float(k)) * c
    t = z + (_LANCZOS_G + 0.5)
    return (z + 0.5) * (torch.log(t) - 1.0) + (_HALF_LOG_2PI - _LANCZOS_G) + torch.log(series)


def _lgamma(x: Tensor) -> Tensor:
    """log |gamma(x)|: Lanczos for x >= 1/2, ``lgamma(x + 1) - log(x)`` on (0, 1/2), the reflection
    formula for x <= 0 (+inf at the poles 0, -1, -2, ... and at +-inf)."""
    upper = x >= 0.5
    small = (x > 0.0) & ~upper
    u = torch.where(upper, x, torch.where(small, x + 1.0, 1.0 - x))
    lg = _lgamma_lanczos(u)
    r = x - torch.round(x)
    log_sin = torch.log(torch.sin(r * math.pi).abs())
    reflected = (math.log(math.pi) - lg) - log_sin
    result = torch.where(upper, lg, torch.where(small, lg - torch.log(x), reflected))
    # the poles explicitly: past 2^52 every float64 is one, and 1 - x overflows Lanczos's terms
    return _where(torch.isinf(x) | ((x <= 0.0) & (r == 0.0)), math.inf, result)


# -- ndtri, erfinv, erfcx ---------------------------------------------------------------------------

#: 1 - exp(-2) computed in each working dtype, as eager computes it
_NDTRI_UPPER = {
    dtype: float(torch.tensor(1.0, dtype=dtype) - torch.tensor(_EXP_M2, dtype=dtype))
    for dtype in (torch.float32, torch.float64)
}


def _ndtri(y0: Tensor) -> Tensor:
    """Inverse of the standard normal distribution function."""
    flip = y0 > _NDTRI_UPPER[y0.dtype]
    y = torch.where(flip, 1.0 - y0, y0)
    yc = y - 0.5
    y2 = yc * yc
    central = (yc + yc * (y2 * _polevl(y2, _NDTRI_P0) / _polevl(y2, _NDTRI_Q0))) * _SQRT_2PI
    t = torch.sqrt(torch.log(y) * -2.0)
    x0 = t - torch.log(t) / t
    z = torch.reciprocal(t)
    near = z * _polevl(z, _NDTRI_P1) / _polevl(z, _NDTRI_Q1)
    far = z * _polevl(z, _NDTRI_P2) / _polevl(z, _NDTRI_Q2)
    tail = x0 - torch.where(t < 8.0, near, far)
    tail = torch.where(flip, tail, -tail)
    result = torch.where(y > _EXP_M2, central, tail)
    result = _where((y0 < 0.0) | (y0 > 1.0), math.nan, result)
    return _where(y0 == 0.0, -math.inf, _where(y0 == 1.0, math.inf, result))


def _erfcx_nonnegative(x: Tensor) -> Tensor:
    """erfcx(x) for x >= 0 (1 / (sqrt(pi) x) beyond 5e7, where that is exact to rounding)."""
    y = (x - _ERFCX_K) / (x + _ERFCX_K)
    series = _clenshaw(y, _ERFCX_C) / (x * 2.0 + 1.0)
    return torch.where(x > 5.0e7, _INV_SQRT_PI / x, series)


def _erfcx(x: Tensor) -> Tensor:
    """Scaled complementary error function exp(x^2) erfc(x)."""
    positive = _erfcx_nonnegative(x.abs())
    return torch.where(x < 0.0, torch.exp(x * x) * 2.0 - positive, positive)


def _erf(x: Tensor) -> Tensor:
    """Error function: Taylor series for |x| < 1/2, ``1 - exp(-x^2) erfcx(|x|)`` beyond."""
    x2 = x * x
    small = x * _polevl(x2, _ERF_TAYLOR)
    large = 1.0 - torch.exp(-x2) * _erfcx_nonnegative(x.abs())
    return torch.where(x.abs() < 0.5, small, _signed(x, large))


def _erfc(x: Tensor) -> Tensor:
    """Complementary error function: ``1 - erf(x)`` (Taylor series) for |x| < 1/2,
    ``exp(-x^2) erfcx(x)`` above and ``2 - exp(-x^2) erfcx(-x)`` below (``1 - erf(x)`` in float32,
    the exporter's form, is 0 past 3.9 where eager's values reach 1e-45)."""
    x2 = x * x
    small = 1.0 - x * _polevl(x2, _ERF_TAYLOR)
    # exp(-x^2) with x = hi + lo, hi of 24 bits: hi * hi is exact, so the rounding of x^2 (1e-13
    # relative at x = 23 in float64, amplified by exp) is not there
    ax = x.abs().clamp(max=64.0)
    hi = ax.to(torch.float32).to(x.dtype)
    tail = torch.exp(-hi * hi) * torch.exp(-(ax - hi) * (ax + hi)) * _erfcx_nonnegative(x.abs())
    return torch.where(x.abs() < 0.5, small, torch.where(x > 0, tail, 2.0 - tail))


def _erf_float64(x: Tensor) -> Any:
    """``erf`` of float64 (ORT has no double Erf kernel; float32 keeps ORT's)."""
    return _erf(x) if x.dtype == torch.float64 else NotImplemented


def _erfinv(y: Tensor) -> Tensor:
    """Inverse error function: a rational first guess refined by two Newton steps."""
    ay = y.abs()
    z = y * y
    num = ((z * _ERFINV_A[3] + _ERFINV_A[2]) * z + _ERFINV_A[1]) * z + _ERFINV_A[0]
    den = (((z * _ERFINV_B[3] + _ERFINV_B[2]) * z + _ERFINV_B[1]) * z + _ERFINV_B[0]) * z + 1.0
    central = y * num / den
    t = torch.sqrt(-torch.log((1.0 - ay) * 0.5))
    num = ((t * _ERFINV_C[3] + _ERFINV_C[2]) * t + _ERFINV_C[1]) * t + _ERFINV_C[0]
    den = (t * _ERFINV_D[1] + _ERFINV_D[0]) * t + 1.0
    tail = _signed(y, num) / den
    x = torch.where(ay <= 0.7, central, tail)
    for _ in range(2):
        x = x - (_erf(x) - y) / (torch.exp(-x * x) * (2.0 / math.sqrt(math.pi)))
    x = torch.where(ay == 1.0, _signed(y, _full(y, math.inf)), x)
    return _where(ay > 1.0, math.nan, x)


# -- sine and cosine of arguments of any size ------------------------------------------------------

#: below this |a|, ``a - n pi/2`` is reduced in float64 by :func:`_reduce_pi` (exact there); above
#: it ORT's own Sin and Cos are accurate (their loss is near multiples of pi/2 of moderate size)
_REDUCE_BELOW = 2.0**27


def _cos_sin(a: Tensor) -> tuple[Tensor, Tensor]:
    """cos(a) and sin(a) of float64 ``a``, accurate relative to the value also near the zeros:
    ``r = a - n pi/2`` in [-pi/4, pi/4] and the quadrant n mod 4 for |a| < 2^27, ORT's Sin and
    Cos of ``a`` itself beyond."""
    near = a.abs() < _REDUCE_BELOW
    an = _where(~near, 0.0, a)
    n = torch.round(an * (2.0 / math.pi))
    r = _reduce_pi(an * 2.0) * 0.5
    c, s = torch.cos(r), torch.sin(r)
    quadrant = n - torch.floor(n * 0.25) * 4.0
    cos = torch.where(
        quadrant == 0.0, c, torch.where(quadrant == 1.0, -s, torch.where(quadrant == 2.0, -c, s))
    )
    sin = torch.where(
        quadrant == 0.0, s, torch.where(quadrant == 1.0, c, torch.where(quadrant == 2.0, -s, -c))
    )
    return torch.where(near, cos, torch.cos(a)), torch.where(near, sin, torch.sin(a))


def _cos_sin_of(a: Tensor) -> tuple[Tensor, Tensor]:
    """cos(a) and sin(a) of float32 or float64 ``a``, in ``a``'s dtype: computed in float64 with
    :func:`_cos_sin` (for float32, of the float32 argument itself, as eager's ``cosf`` takes it)."""
    if a.dtype == torch.float64:
        return _cos_sin(a)
    cos, sin = _cos_sin(a.to(torch.float64))
    return cos.to(a.dtype), sin.to(a.dtype)


# -- Bessel functions of the first and second kind (J0, J1, Y0, Y1) --------------------------------


def _bessel_tail(x: Tensor, w: Tensor, order: int, second_kind: bool) -> Tensor:
    """Hankel's asymptotic form for x > 5: ``sqrt(2 / (pi x)) (P cos(a) - (5 / x) Q sin(a))``
    for J (``P sin(a) + (5 / x) Q cos(a)`` for Y), with a = x - pi/4 (order 0) or x - 3 pi/4
    (order 1) computed in ``x``'s dtype, and P, Q rational functions of ``w`` = 25 / x^2."""
    pp, pq, qp, qq = (_PP0, _PQ0, _QP0, _QQ0) if order == 0 else (_PP1, _PQ1, _QP1, _QQ1)
    p = _polevl(w, pp) / _polevl(w, pq)
    q = 5.0 / x * (_polevl(w, qp) / _polevl(w, qq))
    cos, sin = _cos_sin_of(x - (_QUARTER_PI if order == 0 else _THREE_QUARTER_PI))
    wave = p * sin + q * cos if second_kind else p * cos - q * sin
    return wave * _SQRT_TWO_OVER_PI / torch.sqrt(x)


def _tail_argument(ax: Tensor) -> Tensor:
    """``ax`` where it exceeds 5 (or is NaN), 5 elsewhere: the input of the x > 5 branch."""
    return _where(ax <= 5.0, 5.0, ax)


def _j0_small(x: Tensor) -> Tensor:
    """J0 on [0, 5] (``1 - x^2 / 4`` below 1e-5)."""
    z = x * x
    rational = (z - _J0_R1) * (z - _J0_R2) * _polevl(z, _J0_RP) / _polevl(z, _J0_RQ)
    return torch.where(x < 1.0e-5, 1.0 - z / 4.0, rational)


def _j1_small(x: Tensor) -> Tensor:
    """J1 on [-5, 5]."""
    z = x * x
    return _polevl(z, _J1_RP) / _polevl(z, _J1_RQ) * x * (z - _J1_R1) * (z - _J1_R2)


def _j0(x: Tensor) -> Tensor:
    """Bessel function of the first kind, order 0."""
    ax = x.abs()
    small = ax <= 5.0
    t = _tail_argument(ax)
    tail = _bessel_tail(t, 25.0 / (t * t), 0, second_kind=False)
    return torch.where(small, _j0_small(_where(~small, 0.0, ax)), tail)


def _j1(x: Tensor) -> Tensor:
    """Bessel function of the first kind, order 1 (odd)."""
    small = x.abs() <= 5.0
    t = _tail_argument(x.abs())
    tail = _bessel_tail(t, 5.0 / t * (5.0 / t), 1, second_kind=False)
    return torch.where(small, _j1_small(_where(~small, 0.0, x)), _signed(x, tail))


def _y_domain(x: Tensor, value: Tensor) -> Tensor:
    """Y0/Y1's special values: -inf at 0, NaN for x < 0."""
    return _where(x == 0.0, -math.inf, _where(x < 0.0, math.nan, value))


def _y0(x: Tensor) -> Tensor:
    """Bessel function of the second kind, order 0."""
    small = x <= 5.0
    s = _where(~(small & (x > 0.0)), 1.0, x)
    z = s * s
    near = _polevl(z, _Y0_YP) / _polevl(z, _Y0_YQ) + _TWO_OVER_PI * torch.log(s) * _j0_small(s)
    t = _tail_argument(x)
    tail = _bessel_tail(t, 25.0 / (t * t), 0, second_kind=True)
    return _y_domain(x, torch.where(small, near, tail))


def _y1(x: Tensor) -> Tensor:
    """Bessel function of the second kind, order 1."""
    small = x <= 5.0
    s = _where(~(small & (x > 0.0)), 1.0, x)
    z = s * s
    near = s * (_polevl(z, _Y1_YP) / _polevl(z, _Y1_YQ)) + (
        (_j1_small(s) * torch.log(s) - torch.reciprocal(s)) * _TWO_OVER_PI
    )
    t = _tail_argument(x)
    tail = _bessel_tail(t, 5.0 / t * (5.0 / t), 1, second_kind=True)
    return _y_domain(x, torch.where(small, near, tail))


def _spherical_j0(x: Tensor) -> Tensor:
    """Spherical Bessel function of the first kind, order 0: sin(x) / x (its Taylor series for
    |x| < 1/2, 0 at +-inf)."""
    central = x.abs() < 0.5
    near = _where(~central, 0.0, x)
    series = _polevl(near * near, _SINC_TAYLOR)
    far = _where(central, 1.0, x)
    _, sin = _cos_sin_of(far)
    result = torch.where(central, series, sin / far)
    return _where(torch.isinf(x), 0.0, result)


# -- Airy function Ai -------------------------------------------------------------------------------

#: |x| below which the Maclaurin series is used
_AIRY_SERIES = 2.09
#: Maclaurin terms: enough for the series to reach eager's stopping point on (-2.09, 2.09)
_AIRY_TERMS = 14


def _airy_series(x: Tensor) -> Tensor:
    """Ai on (-2.09, 2.09): ``c1 f(x) - c2 g(x)`` with the Maclaurin series f = 1 + x^3 / 3! + ...
    and g = x + 2 x^4 / 4! + ..., summed (as eager sums them) until a term of f is below
    machine epsilon relative to f."""
    eps = torch.finfo(x.dtype).eps
    z = x * x * x
    f = torch.ones_like(x)
    g = x
    m = torch.ones_like(x)
    n = x
    done = torch.zeros_like(x, dtype=torch.bool)
    k = 1.0
    for _ in range(_AIRY_TERMS):
        m_next = m * z / (k + 1.0)
        n_next = n * z / (k + 2.0)
        m_next = m_next / (k + 2.0)
        f_next = f + m_next
        n_next = n_next / (k + 3.0)
        g_next = g + n_next
        k += 3.0
        m = torch.where(done, m, m_next)
        n = torch.where(done, n, n_next)
        f = torch.where(done, f, f_next)
        g = torch.where(done, g, g_next)
        # eager's loop runs while |m / f| > eps (a NaN stops it)
        done = done | ~((m / f).abs() > eps)
    return f * _AIRY_C1 - g * _AIRY_C2


def _airy_ai(x: Tensor) -> Tensor:
    """Airy function Ai: the Maclaurin series on (-2.09, 2.09), an exponentially decaying rational
    form above (0 beyond 103.892), the oscillating modulus and phase form below (NaN at +-inf)."""
    negative = x < -_AIRY_SERIES
    positive = x >= _AIRY_SERIES
    # x < -2.09
    xn = _where(~negative, -_AIRY_SERIES, x)
    zeta = xn * -2.0 * torch.sqrt(-xn) / 3.0
    z = torch.reciprocal(zeta)
    z2 = z * z
    modulus = z2 * _polevl(z2, _AIRY_AFN) / _polevl(z2, _AIRY_AFD) + 1.0
    phase = z * _polevl(z2, _AIRY_AGN) / _polevl(z2, _AIRY_AGD)
    cos, sin = _cos_sin_of(zeta + 0.25 * math.pi)
    oscillating = _INV_SQRT_PI_AIRY / torch.sqrt(torch.sqrt(-xn)) * (sin * modulus - cos * phase)
    # x >= 2.09
    xp = _where(~positive, _AIRY_SERIES, x)
    zeta = xp * 2.0 * torch.sqrt(xp) / 3.0
    w = torch.reciprocal(zeta)
    decaying = _polevl(w, _AIRY_AN) / _polevl(w, _AIRY_AD) * _INV_SQRT_PI_AIRY
    decaying = decaying / (torch.sqrt(torch.sqrt(xp)) * 2.0 * torch.exp(zeta))
    # |x| < 2.09 (and NaN)
    series = _airy_series(_where(negative | positive, 0.0, x))
    result = torch.where(negative, oscillating, torch.where(positive, decaying, series))
    return _where(torch.isinf(x), math.nan, _where(x > 103.892, 0.0, result))


# -- the table ---------------------------------------------------------------------------------------


def _table() -> dict[Any, Callable[..., Any]]:
    special = {
        _aten.i0.default: _unary(_i0),
        _aten.special_i0e.default: _unary(_i0e),
        _aten.special_i1.default: _unary(_i1),
        _aten.special_i1e.default: _unary(_i1e),
        _aten.special_modified_bessel_i0.default: _unary(_i0, half=False),
        _aten.special_modified_bessel_i1.default: _unary(_i1, half=False),
        _aten.special_modified_bessel_k0.default: _unary(_k0, half=False),
        _aten.special_modified_bessel_k1.default: _unary(_k1, half=False),
        _aten.special_scaled_modified_bessel_k0.default: _unary(_k0e, half=False),
        _aten.special_scaled_modified_bessel_k1.default: _unary(_k1e, half=False),
        _aten.digamma.default: _unary(_digamma),
        _aten.polygamma.default: _polygamma_decomposition,
        _aten.special_zeta.default: _zeta_decomposition,
        _aten.lgamma.default: _unary(_lgamma, wide=True),
        _aten.special_ndtri.default: _unary(_ndtri, half=False),
        _aten.erfinv.default: _unary(_erfinv, wide=True),
        _aten.special_erfcx.default: _unary(_erfcx, wide=True, half=False),
        _aten.erfc.default: _unary(_erfc, wide=True),
        _aten.erf.default: _erf_float64,
        _aten.special_bessel_j0.default: _unary(_j0, half=False),
        _aten.special_bessel_j1.default: _unary(_j1, half=False),
        _aten.special_bessel_y0.default: _unary(_y0, half=False),
        _aten.special_bessel_y1.default: _unary(_y1, half=False),
        _aten.special_spherical_bessel_j0.default: _unary(_spherical_j0, half=False),
        _aten.special_airy_ai.default: _unary(_airy_ai, half=False),
    }
    return special


#: aten overload -> its decomposition into translated ops (see the module docstring)
SPECIAL_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = _table()

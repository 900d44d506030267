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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

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


#: pi in four parts of at most 24 significant bits (the last rounded): n * part is exact for
#: |n| < 2^29, so ``a - n pi`` is computed to about float64 rounding
_PI_PARTS = (3.1415927410125732, -8.742277657347586e-08, -3.4302490200117637e-15, 2.1125998133974855e-23)


def _reduce_pi(a: Tensor) -> Tensor:
    """``a - n pi`` (float64) for the integer n nearest to ``a / pi``: sin and cos of the result
    are those of ``a`` up to the sign ``(-1)^n``, accurate also where ``a`` is close to a
    multiple of pi (ORT's own reduction is not)."""
    n = torch.round(a * (1.0 / math.pi))
    for part in _PI_PARTS:
        a = a - n * part
    return a


# -- modified Bessel functions of the first kind (I0, I1) -------------------------------------------

#: Chebyshev coefficients of exp(-x) I0(x) on [0, 8] (argument x / 2 - 2)
_I0_A = (
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
    1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
    -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
    9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-09,
    -1.30002500998624804212e-08, 6.04699502254191894932e-08, -2.67079385394061173391e-07,
    1.11738753912010371815e-06, -4.41673835845875056359e-06, 1.64484480707288970893e-05,
    -5.75419501008210370398e-05, 1.88502885095841655729e-04, -5.76375574538582365885e-04,
    1.63947561694133579842e-03, -4.32430999505057594430e-03, 1.05464603945949983183e-02,
    -2.37374148058994688156e-02, 4.93052842396707084878e-02, -9.49010970480476444210e-02,
    1.71620901522208775349e-01, -3.04682672343198398683e-01, 6.76795274409476084995e-01,
)  # fmt: skip

#: Chebyshev coefficients of exp(-x) sqrt(x) I0(x) on [8, inf) (argument 32 / x - 2)
_I0_B = (
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
    3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
    1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
    -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
    -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
    3.39623202570838634515e-09, 2.26666899049817806459e-08, 2.04891858946906374183e-07,
    2.89137052083475648297e-06, 6.88975834691682398426e-05, 3.36911647825569408990e-03,
    8.04490411014108831608e-01,
)  # fmt: skip

#: Chebyshev coefficients of exp(-x) I1(x) / x on [0, 8] (argument x / 2 - 2)
_I1_A = (
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
    9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
    -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
    4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
    -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
    2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
    -1.76416518357834055153e-01, 2.52587186443633654823e-01,
)  # fmt: skip

#: Chebyshev coefficients of exp(-x) sqrt(x) I1(x) on [8, inf) (argument 32 / x - 2)
_I1_B = (
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
    -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
    7.78576235018280120474e-01,
)  # fmt: skip


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

#: Chebyshev coefficients of K0(x) + log(x / 2) I0(x) on [0, 2] (argument x^2 - 2)
_K0_A = (
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
    1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
    1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
    -5.35327393233902768720e-01,
)  # fmt: skip

#: Chebyshev coefficients of exp(x) sqrt(x) K0(x) on [2, inf) (argument 8 / x - 2)
_K0_B = (
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
    -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
    6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
    -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
    -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
    2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
    -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e00,
)  # fmt: skip

#: Chebyshev coefficients of x (K1(x) - log(x / 2) I1(x)) on [0, 2] (argument x^2 - 2)
_K1_A = (
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
    -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
    -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
    -3.53155960776544875667e-01, 1.52530022733894777053e00,
)  # fmt: skip

#: Chebyshev coefficients of exp(x) sqrt(x) K1(x) on [2, inf) (argument 8 / x - 2)
_K1_B = (
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
    1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
    -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
    3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
    2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
    -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
    1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e00,
)  # fmt: skip


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

#: digamma(10)
_PSI_10 = 2.25175258906672110764
#: coefficients of the asymptotic series of digamma in 1 / x^2, highest power first
_DIGAMMA_A = (
    8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
    -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
)  # fmt: skip


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


#: Euler-Maclaurin divisors: (2k)! / B_2k
_ZETA_A = (
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18,
)  # fmt: skip
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

#: Lanczos' coefficients for g = 7, nine terms
_LANCZOS_G = 7.0
_LANCZOS = (
    0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
    -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
    1.5056327351493116e-7,
)  # fmt: skip
_HALF_LOG_2PI = 0.91893853320467274178


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

_NDTRI_P0 = (
    -5.99633501014107895267e1, 9.80010754185999661536e1, -5.66762857469070293439e1,
    1.39312609387279679503e1, -1.23916583867381258016e0,
)  # fmt: skip
_NDTRI_Q0 = (
    1.00000000000000000000e0, 1.95448858338141759834e0, 4.67627912898881538453e0,
    8.63602421390890590575e1, -2.25462687854119370527e2, 2.00260212380060660359e2,
    -8.20372256168333339912e1, 1.59056225126211695515e1, -1.18331621121330003142e0,
)  # fmt: skip
_NDTRI_P1 = (
    4.05544892305962419923e0, 3.15251094599893866154e1, 5.71628192246421288162e1,
    4.40805073893200834700e1, 1.46849561928858024014e1, 2.18663306850790267539e0,
    -1.40256079171354495875e-1, -3.50424626827848203418e-2, -8.57456785154685413611e-4,
)  # fmt: skip
_NDTRI_Q1 = (
    1.00000000000000000000e0, 1.57799883256466749731e1, 4.53907635128879210584e1,
    4.13172038254672030440e1, 1.50425385692907503408e1, 2.50464946208309415979e0,
    -1.42182922854787788574e-1, -3.80806407691578277194e-2, -9.33259480895457427372e-4,
)  # fmt: skip
_NDTRI_P2 = (
    3.23774891776946035970e0, 6.91522889068984211695e0, 3.93881025292474443415e0,
    1.33303460815807542389e0, 2.01485389549179081538e-1, 1.23716634817820021358e-2,
    3.01581553508235416007e-4, 2.65806974686737550832e-6, 6.23974539184983293730e-9,
)  # fmt: skip
_NDTRI_Q2 = (
    1.00000000000000000000e0, 6.02427039364742014255e0, 3.67983563856160859403e0,
    1.37702099489081330271e0, 2.16236993594496635890e-1, 1.34204006088543189037e-2,
    3.28014464682127739104e-4, 2.89247864745380683936e-6, 6.79019408009981274425e-9,
)  # fmt: skip
#: exp(-2): below it (and above 1 - it) ndtri uses the expansions in sqrt(-2 log y)
_EXP_M2 = 0.13533528323661269189
_SQRT_2PI = 2.50662827463100050242
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


#: Chebyshev coefficients (lowest order first) of (1 + 2x) erfcx(x) in y = (x - K) / (x + K)
_ERFCX_K = 3.75
_ERFCX_C = (
    1.1775789345674017, -0.004590054580646478, -0.08424913336651792, 0.05920993999819189,
    -0.026658668435305753, 0.009074997670705265, -0.002413163540417608, 0.0004907758365258086,
    -6.916973302501207e-05, 4.13902798607301e-06, 7.74038306619849e-07, -2.1886401049234397e-07,
    1.076499946567091e-08, 4.521959811218287e-09, -7.754400208831351e-10, -6.318088340886684e-11,
    2.86879501093067e-11, 1.9455868545777347e-13, -9.65469674843344e-13, 3.25254814814874e-14,
    3.3478119482868056e-14, -1.864562880419313e-15, -1.2507950530688648e-15, 7.418235256624043e-17,
    5.068148904796111e-17, -2.237056659436e-18, -2.1873429443030182e-18,
)  # fmt: skip
_INV_SQRT_PI = 0.56418958354775628695


def _erfcx_nonnegative(x: Tensor) -> Tensor:
    """erfcx(x) for x >= 0 (1 / (sqrt(pi) x) beyond 5e7, where that is exact to rounding)."""
    y = (x - _ERFCX_K) / (x + _ERFCX_K)
    series = _clenshaw(y, _ERFCX_C) / (x * 2.0 + 1.0)
    return torch.where(x > 5.0e7, _INV_SQRT_PI / x, series)


def _erfcx(x: Tensor) -> Tensor:
    """Scaled complementary error function exp(x^2) erfc(x)."""
    positive = _erfcx_nonnegative(x.abs())
    return torch.where(x < 0.0, torch.exp(x * x) * 2.0 - positive, positive)


#: Taylor coefficients of erf(x) / x in x^2, highest power first
_ERF_TAYLOR = tuple(
    2.0 / math.sqrt(math.pi) * (-1.0) ** n / (math.factorial(n) * (2 * n + 1)) for n in reversed(range(15))
)


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


_ERFINV_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
_ERFINV_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_ERFINV_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_ERFINV_D = (3.543889200, 1.637067800)


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
#
# Every polynomial is evaluated with the listed coefficients only, highest power first, as eager's
# kernel evaluates it: the denominators RQ, YQ and QQ lack the leading 1 of Cephes' tables, which
# moves eager's values off the true functions by up to ~1e-7 relative (more near zeros); these
# decompositions follow eager.

#: rational approximation of the modulus part P of J0/Y0 for x > 5, in 25 / x^2
_PP0 = (
    7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e00,
    5.44725003058768775090e00, 8.74716500199817011941e00, 5.30324038235394892183e00,
    9.99999999999999997821e-01,
)  # fmt: skip
_PQ0 = (
    9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e00,
    5.47097740330417105182e00, 8.76190883237069594232e00, 5.30605288235394617618e00,
    1.00000000000000000218e00,
)  # fmt: skip
#: rational approximation of the phase part Q of J0/Y0 for x > 5, in 25 / x^2
_QP0 = (
    -1.13663838898469149931e-02, -1.28252718670509318512e00, -1.95539544257735972385e01,
    -9.32060152123768231369e01, -1.77681167980488050595e02, -1.47077505154951170175e02,
    -5.14105326766599330220e01, -6.05014350600728481186e00,
)  # fmt: skip
_QQ0 = (
    6.43178256118178023184e01, 8.56430025976980587198e02, 3.88240183605401609683e03,
    7.24046774195652478189e03, 5.93072701187316984827e03, 2.06209331660327847417e03,
    2.42005740240291393179e02,
)  # fmt: skip
#: J0 on [0, 5]: (x^2 - r1^2) (x^2 - r2^2) RP(x^2) / RQ(x^2), r1, r2 the first two zeros
_J0_RP = (
    -4.79443220978201773821e09, 1.95617491946556577543e12, -2.49248344360967716204e14,
    9.70862251047306323952e15,
)  # fmt: skip
_J0_RQ = (
    4.99563147152651017219e02, 1.73785401676374683123e05, 4.84409658339962045305e07,
    1.11855537045356834862e10, 2.11277520115489217587e12, 3.10518229857422583814e14,
    3.18121955943204943306e16, 1.71086294081043136091e18,
)  # fmt: skip
_J0_R1 = 5.78318596294678452118e00
_J0_R2 = 3.04712623436620863991e01
#: Y0 on (0, 5]: YP(x^2) / YQ(x^2) + (2 / pi) log(x) J0(x)
_Y0_YP = (
    1.55924367855235737965e04, -1.46639295903971606143e07, 5.43526477051876500413e09,
    -9.82136065717911466409e11, 8.75906394395366999549e13, -3.46628303384729719441e15,
    4.42733268572569800351e16, -1.84950800436986690637e16,
)  # fmt: skip
_Y0_YQ = (
    1.04128353664259848412e03, 6.26107330137134956842e05, 2.68919633393814121987e08,
    8.64002487103935000337e10, 2.02979612750105546709e13, 3.17157752842975028269e15,
    2.50596256172653059228e17,
)  # fmt: skip

#: rational approximation of the modulus part P of J1/Y1 for x > 5, in (5 / x)^2
_PP1 = (
    7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e00,
    5.11207951146807644818e00, 8.42404590141772420927e00, 5.21451598682361504063e00,
    1.00000000000000000254e00,
)  # fmt: skip
_PQ1 = (
    5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e00,
    5.07386386128601488557e00, 8.39985554327604159757e00, 5.20982848682361821619e00,
    9.99999999999999997461e-01,
)  # fmt: skip
#: rational approximation of the phase part Q of J1/Y1 for x > 5, in (5 / x)^2
_QP1 = (
    5.10862594750176621635e-02, 4.98213872951233449420e00, 7.58238284132545283818e01,
    3.66779609360150777800e02, 7.10856304998926107277e02, 5.97489612400613639965e02,
    2.11688757100572135698e02, 2.52070205858023719784e01,
)  # fmt: skip
_QQ1 = (
    7.42373277035675149943e01, 1.05644886038262816351e03, 4.98641058337653607651e03,
    9.56231892404756170795e03, 7.99704160447350683650e03, 2.82619278517639096600e03,
    3.36093607810698293419e02,
)  # fmt: skip
#: J1 on [0, 5]: x (x^2 - r1^2) (x^2 - r2^2) RP(x^2) / RQ(x^2), r1, r2 the first two zeros
_J1_RP = (
    -8.99971225705559398224e08, 4.52228297998194034323e11, -7.27494245221818276015e13,
    3.68295732863852883286e15,
)  # fmt: skip
_J1_RQ = (
    6.20836478118054335476e02, 2.56987256757748830383e05, 8.35146791431949253037e07,
    2.21511595479792499675e10, 4.74914122079991414898e12, 7.84369607876235854894e14,
    8.95222336184627338078e16, 5.32278620332680085395e18,
)  # fmt: skip
_J1_R1 = 1.46819706421238932572e01
_J1_R2 = 4.92184563216946036703e01
#: Y1 on (0, 5]: x YP(x^2) / YQ(x^2) + (2 / pi) (J1(x) log(x) - 1 / x)
_Y1_YP = (
    1.26320474790178026440e09, -6.47355876379160291031e11, 1.14509511541823727583e14,
    -8.12770255501325109621e15, 2.02439475713594898196e17, -7.78877196265950026825e17,
)  # fmt: skip
_Y1_YQ = (
    5.94301592346128195359e02, 2.35564092943068577943e05, 7.34811944459721705660e07,
    1.87601316108706159478e10, 3.88231277496238566008e12, 6.20557727146953693363e14,
    6.87141087355300489866e16, 3.97270608116560655612e18,
)  # fmt: skip

_TWO_OVER_PI = 0.636619772367581343075535053490057448
_SQRT_TWO_OVER_PI = 0.797884560802865355879892119868763737
_QUARTER_PI = 0.785398163397448309615660845819875721
_THREE_QUARTER_PI = 2.356194490192344928846982537459627163


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


#: Taylor coefficients of sin(x) / x in x^2, highest power first
_SINC_TAYLOR = (
    1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0, 1.0,
)  # fmt: skip


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

#: Ai for x >= 2.09: exp(-zeta) / (2 sqrt(pi) x^(1/4)) AN(1 / zeta) / AD(1 / zeta), zeta = 2/3 x^(3/2)
_AIRY_AN = (
    3.46538101525629032477e-01, 1.20075952739645805542e01, 7.62796053615234516538e01,
    1.68089224934630576269e02, 1.59756391350164413639e02, 7.05360906840444183113e01,
    1.40264691163389668864e01, 9.99999999999999995305e-01,
)  # fmt: skip
_AIRY_AD = (
    5.67594532638770212846e-01, 1.47562562584847203173e01, 8.45138970141474626562e01,
    1.77318088145400459522e02, 1.64234692871529701831e02, 7.14778400825575695274e01,
    1.40959135607834029598e01, 1.00000000000000000470e00,
)  # fmt: skip
#: Ai for x < -2.09: the modulus and phase corrections AFN / AFD and AGN / AGD in 1 / zeta^2
_AIRY_AFN = (
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
    -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
    -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08,
)  # fmt: skip
_AIRY_AFD = (
    1.33560420706553243746e01, 3.26825032795224613948e01, 2.67367040941499554804e01,
    9.18707402907259625840e00, 1.47529146771666414581e00, 1.15687173795188044134e-01,
    4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07,
)  # fmt: skip
_AIRY_AGN = (
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e00,
    9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
    5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
    8.11789239554389293311e-08, 3.41551784765923618484e-10,
)  # fmt: skip
_AIRY_AGD = (
    9.30892908077441974853e00, 1.98352928718312140417e01, 1.55646628932864612953e01,
    5.47686069422975497931e00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
    4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
    4.91834570062930015649e-09,
)  # fmt: skip
_INV_SQRT_PI_AIRY = 5.64189583547756286948e-01
#: Ai(0) and -Ai'(0): the weights of the two Maclaurin series f and g
_AIRY_C1 = 0.355028053887817239260
_AIRY_C2 = 0.258819403792806798405
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

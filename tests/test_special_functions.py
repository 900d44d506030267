"""PyTorch's special functions on ORT (``ort_lazy.lowering.special``): eager's values on grids that
cover every branch of each approximation, its tails, poles and special values (0, -0, +-inf, NaN),
and proof that ORT ran the whole graph (no silent fallback)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from helpers import compile_ort, tiered
from ort_lazy import metrics

S = torch.special
F64 = torch.float64

#: (rtol, atol) per dtype, those of the OpInfo parity suite (atol is not scaled here)
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (4e-2, 4e-2),
}

SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan]


def _grid(*parts: torch.Tensor | list[float]) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=F64) for p in parts])


#: across both I/K expansions (break points 2 and 8), the tails and overflow
BESSEL_X = _grid(
    torch.linspace(-30, 30, 241),
    torch.logspace(-8, 2.9, 40),
    -torch.logspace(-8, 2.9, 40),
    [2.0, -2.0, 8.0, -8.0, 1e-300, 700.0, 720.0, -720.0, 1e300],
    SPECIAL,
)
#: Bessel J/Y, spherical j0, Airy Ai: the switches at 5 (J/Y), 0.5 (j0), +-2.09, 8.32 and 103.892
#: (Ai), the tails up to 1e300 with their large sine/cosine arguments (both sides of 2^27, where
#: the argument reduction changes), negative x (NaN for Y)
BESSEL_JY_X = _grid(
    BESSEL_X,
    torch.logspace(3, 300, 30),
    -torch.logspace(3, 300, 10),
    [5.0, -5.0, 25.0, 1e-5, -1e-5, 0.4999, 0.5, -0.5, 2.09, -2.09, 8.33, 103.9, 1e3, 1e8, 1e20, -1e20],
    [2.0**27 - 0.5, 2.0**27 + 1.0, 3e9, 1e15, -1e8 * math.pi],
)
#: the recurrence and asymptotic regions, negative non-integers, poles at 0, -1, -2, ...
GAMMA_X = _grid(
    torch.linspace(-12.25, 25, 150),
    torch.arange(-6, 11),
    torch.arange(-6, 0) + 1e-6,
    torch.logspace(-8, 20, 30),
    [0.5, 1e-300, 1e300],
    SPECIAL,
)
#: inside (-1, 1) on both sides of erfinv's 0.7 switch, towards +-1, and the domain ends
ERFINV_Y = _grid(
    torch.linspace(-0.999, 0.999, 201),
    1 - torch.logspace(-10, -1, 20),
    -1 + torch.logspace(-10, -1, 20),
    [0.7, -0.7, 1.0, -1.0, 1.5, -1.5, 1e-300],
    SPECIAL,
)
#: all three ndtri approximations (switches at exp(-2), 1 - exp(-2), exp(-32)), outside [0, 1]
NDTRI_P = _grid(
    torch.linspace(0.001, 0.999, 151),
    torch.logspace(-300, -1, 40),
    1 - torch.logspace(-15, -1, 20),
    [math.exp(-2), 1 - math.exp(-2), math.exp(-32), 0.0, 1.0, -0.5, 1.5, 0.5],
    [math.inf, -math.inf, math.nan],
)
#: erfcx: negative side (overflow below -26.7), the Chebyshev range and the 1 / x tail
ERFCX_X = _grid(
    torch.linspace(-27, 40, 201),
    torch.logspace(-8, 10, 40),
    -torch.logspace(-8, 1.4, 20),
    [-26.5, -27.0, 5e7, 6e7, 1e300],
    SPECIAL,
)


def _assert_matches(got: torch.Tensor, expected: torch.Tensor, label: str) -> None:
    """Same dtype, NaN and infinities, finite values within the dtype's tolerance."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, label
    rtol, atol = TOLERANCES[expected.dtype]
    assert torch.equal(got.isnan(), expected.isnan()), (label, got, expected)
    infinite = expected.isinf()
    assert torch.equal(got[infinite], expected[infinite]), (label, got[infinite], expected[infinite])
    finite = expected.isfinite()
    g, e = got[finite].double(), expected[finite].double()
    err = (g - e).abs() - (atol + rtol * e.abs())
    worst = int(err.argmax()) if err.numel() else 0
    assert not bool((err > 0).any()), (label, float(g[worst]), float(e[worst]))


def _check(cases: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]]) -> None:
    """Every function of ``cases`` (name: (function, input)), compiled as one graph, matches eager,
    and ORT ran all of it."""
    names = list(cases)
    inputs = [cases[name][1] for name in names]

    def together(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(cases[name][0](x) for name, x in zip(names, xs))

    expected = together(*inputs)
    got = compile_ort(together)(*inputs)
    c = metrics.counters()
    assert c["ort_runs"] >= 1 and c["fallback_ops"] == 0, metrics.fallbacks()
    for name, g, e, x in zip(names, got, expected, inputs):
        _assert_matches(g, e, f"{name} {x.dtype}")


BESSEL = {
    "i0": torch.i0,
    "i0e": S.i0e,
    "i1": S.i1,
    "i1e": S.i1e,
    "modified_bessel_i0": S.modified_bessel_i0,
    "modified_bessel_i1": S.modified_bessel_i1,
    "modified_bessel_k0": S.modified_bessel_k0,
    "modified_bessel_k1": S.modified_bessel_k1,
    "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1,
}
#: functions without a float16/bfloat16 kernel in eager
BESSEL_JY = {
    "bessel_j0": S.bessel_j0,
    "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0,
    "bessel_y1": S.bessel_y1,
    "spherical_bessel_j0": S.spherical_bessel_j0,
    "airy_ai": S.airy_ai,
}
#: the functions eager also computes for float16/bfloat16
HALF_BESSEL = ("i0", "i0e", "i1", "i1e")

GAMMA = {
    "digamma": torch.digamma,
    "lgamma": torch.lgamma,
    "trigamma": lambda x: torch.polygamma(1, x),
    "polygamma_2": lambda x: torch.polygamma(2, x),
    "polygamma_3": lambda x: S.polygamma(3, x),
}
#: far left of the reflection formulas (eager's zeta, hence polygamma n >= 2, sums one term per
#: unit of distance there)
FAR_LEFT = _grid([-1e10 + 0.5, -1e5 - 0.25, -123.7, -1e300])

INVERSE = {"erfinv": (torch.erfinv, ERFINV_Y), "ndtri": (S.ndtri, NDTRI_P), "erfcx": (S.erfcx, ERFCX_X)}


@pytest.mark.parametrize("dtype", [pytest.param(torch.float64, marks=pytest.mark.full), torch.float32], ids=str)
def test_bessel_and_error_functions(dtype: torch.dtype) -> None:
    """The I/K/J/Y Bessel, Airy and the inverse/scaled error functions of float64 and float32."""
    cases = {name: (fn, BESSEL_X.to(dtype)) for name, fn in BESSEL.items()}
    cases.update({name: (fn, BESSEL_JY_X.to(dtype)) for name, fn in BESSEL_JY.items()})
    cases.update({name: (fn, x.to(dtype)) for name, (fn, x) in INVERSE.items()})
    _check(cases)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float64, marks=pytest.mark.full), torch.float32], ids=str)
@pytest.mark.parametrize("name", tiered(list(GAMMA), lambda n: n != "polygamma_3"))
def test_gamma_family(name: str, dtype: torch.dtype) -> None:
    """One graph per function (see test_float32_pi_product_next_to_float64_one)."""
    cases = {name: (GAMMA[name], GAMMA_X.to(dtype))}
    if name in ("digamma", "lgamma"):
        cases[f"{name} far left"] = (GAMMA[name], FAR_LEFT.to(dtype))
    if name == "trigamma":  # sin(pi x) is reduced exactly for |x| < 2^29 only
        cases[f"{name} far left"] = (GAMMA[name], FAR_LEFT[1:3].to(dtype))
    if name.startswith("polygamma"):  # eager sums 1e5 terms there (zeta's direct sum stopped at 40)
        cases[f"{name} far left"] = (GAMMA[name], FAR_LEFT[1:3].to(dtype))
    _check(cases)


def test_float32_pi_product_next_to_float64_one() -> None:
    """digamma of float32 computes pi / tan(pi r) in float64 with pi in parts, the first part
    float32's pi; beside a float32 ``x * math.pi`` (trigamma, or the user's) a constant of that
    value was taken for a rounded pi and restored to pi (3% off near the poles)."""
    x = torch.tensor([-19.999998092651367, -3.999999, 2.5])
    _check({"digamma": (torch.digamma, x), "x * pi": (lambda t: t * math.pi, x)})


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=pytest.mark.full) for d in (torch.float16, torch.bfloat16)], ids=str)
def test_half_types(dtype: torch.dtype) -> None:
    """Computed in float32 and rounded once, as eager does."""
    cases = {name: (BESSEL[name], BESSEL_X.to(dtype)) for name in HALF_BESSEL}
    cases.update({name: (fn, GAMMA_X.to(dtype)) for name, fn in GAMMA.items()})
    cases["erfinv"] = (torch.erfinv, ERFINV_Y.to(dtype))
    _check(cases)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float64, marks=pytest.mark.full), torch.float32], ids=str)
def test_hurwitz_zeta(dtype: torch.dtype) -> None:
    s = torch.tensor([1.0, 1.5, 2.0, 3.0, 4.5, 7.0, 30.0, 0.5, 1.000001, math.nan, math.inf], dtype=F64)
    # and below ZETA_MIN_Q, where eager's direct sum takes one term per unit of distance
    q = _grid(torch.linspace(-20.5, 20, 83), [0.0, -0.0, -3.0, 1e-8, 1e8, math.inf, math.nan, -31.0, -40.5, -123.7, -1e5 - 0.25])
    grid_s, grid_q = torch.meshgrid(s, q, indexing="ij")
    x, y = grid_s.reshape(-1).to(dtype), grid_q.reshape(-1).to(dtype)
    expected = S.zeta(x, y)
    got = compile_ort(S.zeta)(x, y)
    c = metrics.counters()
    assert c["ort_runs"] >= 1 and c["fallback_ops"] == 0, metrics.fallbacks()
    _assert_matches(got, expected, f"zeta {dtype}")


def test_integer_inputs_promote() -> None:
    x = torch.arange(-5, 6)
    fns = {
        "i0": torch.i0,
        "digamma": torch.digamma,
        "lgamma": torch.lgamma,
        "k1": S.modified_bessel_k1,
        "y0": S.bessel_y0,
        "spherical_j0": S.spherical_bessel_j0,
    }
    _check({name: (fn, x) for name, fn in fns.items()})


def test_gradients_on_ort() -> None:
    """The backward formulas call other special functions (i0' = i1, lgamma' = digamma,
    digamma' = trigamma, ...): they run on ORT too, with eager's gradients. Eager gives the
    Bessel J/Y, spherical j0 and Airy functions no derivative; compiled, they add none either."""
    x = torch.tensor([0.3, 1.7, 4.0, 9.5, -2.5], dtype=F64)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return (
            torch.i0(t) + S.i1e(t) + torch.lgamma(t) + torch.digamma(t) + S.erfcx(t) + torch.erfinv(t / 10)
        ).sum() + (S.bessel_j0(t) + S.bessel_y1(t) + S.spherical_bessel_j0(t) + S.airy_ai(t)).sum()

    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(fn(leaf), leaf)
    leaf = x.clone().requires_grad_()
    (got,) = torch.autograd.grad(compile_ort(fn)(leaf), leaf)
    c = metrics.counters()
    assert c["ort_runs"] >= 2 and c["fallback_ops"] == 0, metrics.fallbacks()
    _assert_matches(got, expected, "gradient")

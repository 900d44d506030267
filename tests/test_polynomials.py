"""torch.special's orthogonal polynomials on ORT against eager, over every branch of PyTorch's
algorithm: negative / zero / one / small / large / non-integer degrees, the special arguments
(±1, 0 and 1 for the shifted kinds), the trigonometric form inside (-1, 1), |x| > 1 up to
overflow, infinities, NaN degrees and Hermite's degree limits."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import compile_ort
from ort_lazy import metrics

NAMES = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]

#: scaled tolerance: |ort - eager| <= TOL * max(1, |eager|) (plus, for the trigonometric form of
#: the Chebyshev kinds, 16 epsilon per unit of degree: the C library's float32 acos is not always
#: correctly rounded, and an angle one unit in the last place away moves cos(n * angle) by n of them)
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}

_X = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -0.5,
    0.3,
    -0.7,
    0.999,
    -0.999,
    1.001,
    -1.001,
    1.5,
    -2.0,
    3.0,
    -25.0,
    1e3,
    1e20,
    0.25,
    0.75,
    0.1,
    1e-30,
    math.inf,
    -math.inf,
]
_N = [
    *range(-2, 41),
    -0.5,
    0.5,
    2.7,
    6.9,
    7.2,
    8.5,
    64,
    100,
    127,
    128,
    129,
    300,
    511,
    512,
    513,
    1e30,
    -1e19,
    math.nan,
    math.inf,
    -math.inf,
]


def _grid(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    xs = list(_X)
    if name.startswith("shifted"):  # 2x - 1 in the grid too (1e-30 would be -1: a loop as long as n)
        xs = [v for v in xs if v != 1e-30] + [(v + 1) / 2 for v in xs if v != 1e-30]
    x = torch.tensor(xs, dtype=torch.float64).to(dtype)[:, None]
    n = torch.tensor(_N, dtype=torch.float64).to(dtype)[None, :]
    return x, n


def _assert_matches(
    got: torch.Tensor, expected: torch.Tensor, tol: float, n: torch.Tensor | None = None
) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.isnan(), expected.isnan())
    inf = expected.isinf()
    assert torch.equal(got[inf], expected[inf]) and torch.equal(got.isinf(), inf)
    finite = expected.isfinite()
    e, g = expected[finite].double(), got[finite].double()
    allowed = torch.full_like(e, tol)
    if n is not None:
        degree = n.double().nan_to_num(0.0, 0.0, 0.0).clamp(0, 1e6).trunc().expand_as(expected)[finite]
        allowed = allowed + 16 * torch.finfo(expected.dtype).eps * degree
    scaled = (g - e).abs() / e.abs().clamp_min(1.0)
    assert bool((scaled <= allowed).all()), float((scaled - allowed).max())


def _assert_on_ort() -> None:
    c = metrics.counters()
    assert c["ort_runs"] >= 1 and c["fallback_ops"] == 0, metrics.fallbacks()


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.float64, marks=pytest.mark.full)], ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_polynomial_matches_eager(name: str, dtype: torch.dtype) -> None:
    fn = getattr(torch.special, name)
    x, n = _grid(name, dtype)
    got = compile_ort(lambda a, b: fn(a, b))(x, n)
    _assert_on_ort()
    _assert_matches(got, fn(x, n), TOL[dtype], n)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_u", "hermite_polynomial_h", "legendre_polynomial_p"])
def test_polynomial_scalars_and_integers(name: str) -> None:
    fn = getattr(torch.special, name)
    x = torch.tensor([-2.0, -1.0, -0.4, 0.0, 0.6, 1.0, 1.5])
    n = torch.tensor([-1, 0, 1, 2, 5, 9, 12])
    cases = [
        (lambda a: fn(a, 7), (x,)),  # degree a Python number
        (lambda b: fn(0.3, b), (n,)),  # argument a Python number
        (lambda a, b: fn(a, b), (x.double(), n)),  # int64 degrees
        (lambda a, b: fn(a, b), (torch.tensor([-2, -1, 0, 1, 2, 3, 4]), n)),  # integers: float32
    ]
    for fn_case, args in cases:
        got = compile_ort(fn_case)(*args)
        _assert_on_ort()
        expected = fn_case(*args)
        _assert_matches(got, expected, TOL[expected.dtype], n)
        metrics.reset()


def test_polynomial_nan_argument_at_degrees_zero_and_one() -> None:
    x = torch.tensor([math.nan, math.nan, math.nan], dtype=torch.float64)
    n = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)
    for name in NAMES:
        fn = getattr(torch.special, name)
        got = compile_ort(lambda a, b, fn=fn: fn(a, b))(x, n)
        _assert_on_ort()
        _assert_matches(got, fn(x, n), 0.0)
        metrics.reset()

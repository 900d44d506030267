"""``beta * self + alpha * product`` ops (``addmm``, ``addmv``, ``addbmm``, ``baddbmm``,
``addr``) on the dynamo path, with the scalars eager treats specially.

``beta=0`` ignores ``self`` in eager, NaN and inf included (attention code passes
``torch.empty`` there: ``baddbmm(empty, q, k, beta=0, alpha=scale)``); the translations of
``addmv``/``addbmm``/``baddbmm`` multiplied it by 0 and returned NaN, silently. float64 ``alpha``
and ``beta`` went into float32 Gemm attributes (1e-8 to 2e-7 off). Every case checks that ORT ran.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ort_lazy import metrics

#: name: (op, self's shape, the two operands' shapes)
OPS: dict[str, tuple[Callable[..., torch.Tensor], tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "addmm": (torch.addmm, (2, 3), ((2, 4), (4, 3))),
    "addmm-broadcast-self": (torch.addmm, (3,), ((2, 4), (4, 3))),
    "addmv": (torch.addmv, (3,), ((3, 4), (4,))),
    "addbmm": (torch.addbmm, (2, 3), ((5, 2, 4), (5, 4, 3))),
    "baddbmm": (torch.baddbmm, (5, 2, 3), ((5, 2, 4), (5, 4, 3))),
    "addr": (torch.addr, (2, 3), ((2,), (3,))),
}

#: name: (self's fill: None for random values, beta, alpha)
SCALARS = {
    "beta-0-nan-self": (float("nan"), 0, 1),
    "beta-0-inf-self-alpha": (float("inf"), 0.0, 0.5),
    "inexact-alpha-beta": (None, 0.2, 0.6),
    "defaults": (None, 1, 1),
}

_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("scalars", list(SCALARS))
@pytest.mark.parametrize("name", list(OPS))
def test_scaled_products_follow_eager(name: str, scalars: str, dtype: torch.dtype) -> None:
    op, self_shape, (a_shape, b_shape) = OPS[name]
    fill, beta, alpha = SCALARS[scalars]
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(a_shape, generator=gen).to(dtype)
    b = torch.randn(b_shape, generator=gen).to(dtype)
    self = torch.randn(self_shape, generator=gen).to(dtype) if fill is None else torch.full(self_shape, fill, dtype=dtype)

    def f(s: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return op(s, x, y, beta=beta, alpha=alpha)

    expected = f(self, a, b)
    torch._dynamo.reset()
    metrics.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="ort")(self, a, b)
    assert metrics.counters()["ort_runs"] >= 1, metrics.report()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    tol = _TOLERANCE[dtype]
    assert torch.allclose(got.double(), expected.double(), rtol=tol, atol=tol, equal_nan=True), (got, expected)


@pytest.mark.parametrize("name", list(OPS))
def test_scaled_products_with_beta_0_train(name: str) -> None:
    """The gradients with ``beta=0``: zero for ``self`` (as eager's), the products' as eager's,
    with NaN in ``self``."""
    op, self_shape, (a_shape, b_shape) = OPS[name]
    gen = torch.Generator().manual_seed(1)
    leaves = [torch.full(self_shape, float("nan")), torch.randn(a_shape, generator=gen), torch.randn(b_shape, generator=gen)]

    def f(s: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return op(s, x, y, beta=0, alpha=0.5).sin()

    def grads(fn: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        inputs = [t.clone().requires_grad_() for t in leaves]
        fn(*inputs).sum().backward()
        return [t.grad for t in inputs]

    expected = grads(f)
    torch._dynamo.reset()
    metrics.reset()
    got = grads(torch.compile(f, backend="ort"))
    assert metrics.counters()["ort_runs"] >= 2, metrics.report()
    for g, e in zip(got, expected):
        assert torch.allclose(g, e, rtol=1e-5, atol=1e-6, equal_nan=True), (g, e)

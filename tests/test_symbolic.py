"""Numbers computed from symbolic sizes (``dynamic=True``) that tensor ops read: ``x / n``,
``x * (n / 3)``, ``x ** (n / 7)``, fills, bounds, comparisons, means and batch norms, in every
dtype, on ORT with eager's results. The class of a float64 graph reading ``n / 3`` rounded to
float32 (1e-7 off, silently), of ``prims.div(x, n)`` in float64/float16/bfloat16 batch norms
(ill-typed, left to PyTorch) and of ``Scalar`` overloads that failed to translate a symbolic
number. And views of inputs a graph returns, with symbolic sizes (a column slice came back
with the wrong elements: AOTAutograd rebuilt it with an ORT output's contiguous strides)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from helpers import tiered
from ort_lazy import metrics

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32)

#: name: (function of x whose leading size is symbolic, dtypes it is run in)
CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[torch.dtype, ...]]] = {
    "divide-by-size": (lambda x: x / x.shape[0], FLOATS + INTS),
    "times-size-ratio": (lambda x: x * (x.shape[0] / 3), FLOATS + INTS),
    "plus-size": (lambda x: x + x.shape[0], FLOATS + INTS),
    "minus-root-of-size": (lambda x: x - x.shape[0] ** 0.5, (torch.float64, torch.float32)),
    "power-size-ratio": (lambda x: x.abs() ** (x.shape[0] / 7), FLOATS + INTS),
    "fill-size-ratio": (lambda x: x + torch.full((1,), x.shape[0] / 3, dtype=x.dtype), (torch.float64, torch.float32)),
    "where-size-ratio": (lambda x: torch.where(x > 0, x, x.shape[0] / 3), (torch.float64, torch.float32, torch.int64)),
    "clamp-size-ratio": (lambda x: x.clamp(max=x.shape[0] / 3), (torch.float64, torch.float32)),
    "compare-size-ratio": (lambda x: x * (x > x.shape[0] / 3), (torch.float64, torch.float32, torch.int64)),
    "mean": (lambda x: x.mean(0), FLOATS),
    "variance": (lambda x: x.var(0), FLOATS),
    "batch-norm-no-stats": (lambda x: F.batch_norm(x, None, None, training=True), FLOATS),
}

PARAMS = [pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}") for name, (_, dtypes) in CASES.items() for dtype in dtypes]

BATCHES = (2, 3, 5)


def _input(batch: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(batch, 4, generator=torch.Generator().manual_seed(batch)) * 3
    return x.round().to(dtype) if not dtype.is_floating_point else x.to(dtype)


def _check(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor | None) -> None:
    """float64/float32/integers: eager's result (float64 to 1e-13 of the largest value); float16
    and bfloat16: no further from the float64 result than eager is, give or take one rounding."""
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = float(want.double().abs().max()) or 1.0
    diff = float((got.double() - want.double()).abs().max())
    if want.dtype in (torch.float16, torch.bfloat16):
        assert exact is not None
        eps = torch.finfo(want.dtype).eps
        ours = float((got.double() - exact).abs().max())
        theirs = float((want.double() - exact).abs().max())
        assert ours <= 2 * theirs + eps * scale, (ours, theirs)
    elif want.dtype == torch.float64:
        assert diff <= 1e-13 * scale, diff
    elif want.dtype == torch.float32:
        assert diff <= 1e-6 * scale, diff
    else:
        assert diff == 0, diff


@pytest.mark.parametrize("name,dtype", tiered(PARAMS, 2, unpack=True))
def test_symbolic_numbers_on_ort(name: str, dtype: torch.dtype) -> None:
    fn = CASES[name][0]
    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(fn, backend="ort", dynamic=True)
    for batch in BATCHES:
        x = _input(batch, dtype)
        exact = fn(x.double()) if dtype in (torch.float16, torch.bfloat16) else None
        _check(compiled(x), fn(x), exact)
    c = metrics.counters()
    assert c["ort_runs"] >= len(BATCHES) and c["fallback_ops"] == 0 and c["export_failures"] == 0, c
    assert c["graphs_compiled"] == 1, c  # one graph serves every batch: the sizes stayed symbolic
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d)[6:])
def test_batch_norm_training_with_a_dynamic_batch(dtype: torch.dtype) -> None:
    """BatchNorm in training with running statistics, batches of 2, 3 and 5: outputs, input and
    weight gradients and the running variance (its ``n / (n - 1)`` correction a symbolic float)
    as eager's, everything on ORT."""

    def run(backend: str) -> list[list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).to(dtype).train()
        step = torch.compile(model, backend=backend, dynamic=True) if backend != "eager" else model
        results = []
        for batch in BATCHES:
            x = _input(batch, dtype).requires_grad_()
            model.zero_grad()
            out = step(x)
            (out * torch.linspace(-1, 1, 6, dtype=dtype)).sum().backward()
            results.append([out.detach(), x.grad, model[0].weight.grad, model[1].weight.grad, model[1].running_var.clone()])
        return results

    want = run("eager")
    torch._dynamo.reset()
    metrics.reset()
    got = run("ort")
    c = metrics.counters()
    torch._dynamo.reset()
    assert c["ort_runs"] >= 2 * len(BATCHES) and c["export_failures"] == 0, c
    # in PyTorch by design only: the running statistics' in-place write-back and the batch norm
    # backward (a default torch_preferred_ops entry); the forward's statistics on ORT
    assert set(metrics.fallbacks()) == {"aten.copy_.default", "aten.native_batch_norm_backward.default"}, metrics.fallbacks()
    rtol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)
    for got_step, want_step in zip(got, want):
        # floor: the step's largest value, for the input gradient, which is near zero here (batch
        # norm's gradient removes its mean and its projection on the normalized input: 1e-8 in float32)
        floor = rtol * max(float(e.double().abs().max()) for e in want_step)
        for a, e in zip(got_step, want_step):
            scale = float(e.double().abs().max())
            assert float((a.double() - e.double()).abs().max()) <= rtol * scale + floor, (dtype, a, e)


#: name: a view of x whose sizes or offsets follow x's symbolic sizes (so AOTAutograd cannot
#: replay it on the input and rebuilds it from the strides of the tensor the graph returns)
RETURNED_VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "narrow": lambda x: x.narrow(1, 1, x.shape[1] - 2),
    "column-slice": lambda x: x[:, : x.shape[1] // 2],
    "transposed-slice": lambda x: x.t()[1 : x.shape[1] - 1],
    "expand": lambda x: x[:, :1].expand(x.shape[0], x.shape[1] * 2),
    "unsqueezed-expand": lambda x: x.unsqueeze(1).expand(x.shape[0], 3, x.shape[1]),
    "chunk": lambda x: x.split(x.shape[1] // 2, dim=1)[1],
    "diagonal": lambda x: x.diagonal(offset=x.shape[1] - x.shape[0]),
    "last-row": lambda x: x[x.shape[0] - 1],
    "strided-rows": lambda x: x[1::2, 1:],
}


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("name", tiered(list(RETURNED_VIEWS), 2))
def test_returned_views_of_inputs_with_symbolic_sizes(name: str, grad: bool, dynamic: bool | None) -> None:
    """A graph returning a view of its input (beside work on ORT), over three input sizes:
    ``dynamic=True``, and the automatic dynamic shapes a second size brings. The view is
    eager's, element for element and as a view of the input, and so is its gradient."""
    view = RETURNED_VIEWS[name]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return view(x), (x.sin() + 1).sum(0)

    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(fn, backend="ort", dynamic=dynamic)
    for i, shape in enumerate(((4, 6), (6, 8), (5, 7))):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))
        x_ort = x.clone().requires_grad_(grad)
        x_eager = x.clone().requires_grad_(grad)
        got, want = compiled(x_ort), fn(x_eager)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.allclose(g, w, rtol=1e-6, atol=1e-6), (shape, g, w)
        assert torch.equal(got[0], want[0])
        if dynamic or i > 0:  # symbolic sizes: made in PyTorch, a view of the input as eager's
            assert got[0].untyped_storage().data_ptr() == x_ort.untyped_storage().data_ptr()
        if grad:
            weights = [torch.linspace(-1, 1, t.numel()).view(t.shape) for t in want]
            (g_ort,) = torch.autograd.grad(sum((t * w).sum() for t, w in zip(got, weights)), x_ort)
            (g_eager,) = torch.autograd.grad(sum((t * w).sum() for t, w in zip(want, weights)), x_eager)
            torch.testing.assert_close(g_ort, g_eager)
    c = metrics.counters()
    assert c["ort_runs"] >= 3 and c["export_failures"] == 0, c
    torch._dynamo.reset()

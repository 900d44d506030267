"""Numbers computed from symbolic sizes (``dynamic=True``) that tensor ops read: ``x / n``,
``x * (n / 3)``, ``x ** (n / 7)``, fills, bounds, comparisons, means and batch norms, in every
dtype, on ORT with eager's results. The class of a float64 graph reading ``n / 3`` rounded to
float32 (1e-7 off, silently), of ``prims.div(x, n)`` in float64/float16/bfloat16 batch norms
(ill-typed, left to PyTorch) and of ``Scalar`` overloads that failed to translate a symbolic
number."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

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


@pytest.mark.parametrize("name,dtype", PARAMS)
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

"""The ``fast_math`` option: ORT's approximate logistic and max pooling without eager's NaN rule.

Off by default, every exact path stays (``test_correctness``'s tails and NaN-rule tests). On,
each test checks that the option really reaches the model (the exact forms are gone, and ORT's
logistic gives its documented 0 far in the negative tail), that results stay within the
documented error of eager's elsewhere, forward and backward, that ORT ran, and that exact and
fast models never share a cache entry.
"""

from __future__ import annotations

import math

import onnx
import pytest
import torch
from torch import nn

from helpers import assert_close, assert_ran_on_ort, captured_exports, compile_ort
from ort_lazy import metrics
from ort_lazy.options import Options, OptionsError


def _ops(models: list) -> set[str]:
    """The op types of the exported models, subgraphs left out."""
    return {n.op_type for m in models for n in onnx.load_from_string(m.model_bytes).graph.node}


class _Gated(nn.Module):
    """Linear -> SiLU -> Linear -> sigmoid: both places ort-lazy otherwise writes out exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.b(nn.functional.silu(self.a(x))))


class _Pooled(nn.Module):
    """conv -> ReLU -> max pooling -> conv, the stem of every ResNet."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, 1))


def test_option_is_parsed_and_changes_the_cache_key() -> None:
    assert Options().fast_math is False
    assert Options(fast_math="1").fast_math is True
    assert Options.from_env({"ORT_LAZY_FAST_MATH": "on"}).fast_math is True
    assert Options(fast_math=True).key() != Options().key()
    with pytest.raises(OptionsError, match="fast_math"):
        Options(fast_math="sometimes")


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_sigmoid_and_silu_keep_ort_s_logistic(training: bool) -> None:
    """Exact (default): no ``Sigmoid`` node left (``1 / (1 + exp(-x))``). Fast: ORT's ``Sigmoid``
    (which ORT fuses with the ``Mul`` of SiLU into ``QuickGelu``), values and gradients within
    1e-6 of the largest output of eager's."""
    torch.manual_seed(0)
    model = _Gated()
    x = torch.randn(4, 16, requires_grad=training)
    seen = {}
    for fast in (False, True):
        metrics.reset()
        with captured_exports() as models, torch.set_grad_enabled(training):
            got = compile_ort(model, fast_math=fast)(x)
            if training:
                got.sum().backward()
        assert_ran_on_ort()
        assert metrics.counters()["fallback_ops"] == 0, metrics.fallbacks()
        seen[fast] = _ops(models)
        with torch.set_grad_enabled(training):
            expected = model(x)
        assert_close(got.detach(), expected.detach(), rtol=0, atol=1e-6)
        if training:
            grad = x.grad.clone()
            x.grad = None
            expected.sum().backward()
            assert_close(grad, x.grad, rtol=0, atol=1e-6)
            x.grad = None
    assert "Sigmoid" not in seen[False] and "Exp" in seen[False], seen[False]
    assert "Sigmoid" in seen[True] and "Exp" not in seen[True], seen[True]


def test_the_approximation_reaches_the_session() -> None:
    """Far in the negative tail ORT's logistic gives 0 (where eager's is 9e-14 at -30): the
    trade the option makes, and the sign that the session runs ORT's kernel."""
    x = torch.tensor([-30.0, -2.0, 0.0, 2.0])
    with torch.no_grad():
        exact = compile_ort(torch.sigmoid)(x)
        fast = compile_ort(torch.sigmoid, fast_math=True)(x)
    assert_ran_on_ort()
    assert torch.equal(exact, torch.sigmoid(x))
    assert float(fast[0]) == 0.0 and float(exact[0]) > 0.0
    assert_close(fast[1:], torch.sigmoid(x[1:]), rtol=0, atol=1e-6)


@pytest.mark.usefixtures("exact_forms")
def test_max_pooling_without_the_nan_rule() -> None:
    """Exact: the NaN rule's ``If`` around the pooling. Fast: one ``MaxPool`` and nothing else
    of the rule (so ORT can fuse the blocked-layout convolutions around it); finite inputs give
    eager's values, and a NaN changes nothing but the windows holding it."""
    torch.manual_seed(0)
    model = _Pooled().eval()
    x = torch.randn(2, 3, 16, 16)
    seen = {}
    for fast in (False, True):
        metrics.reset()
        with captured_exports() as models, torch.no_grad():
            got = compile_ort(model, fast_math=fast)(x)
        assert_ran_on_ort()
        assert metrics.counters()["fallback_ops"] == 0, metrics.fallbacks()
        seen[fast] = _ops(models)
        with torch.no_grad():
            assert_close(got, model(x))
    assert {"If", "IsNaN", "MaxPool"} <= seen[False], seen[False]
    assert "MaxPool" in seen[True] and not {"If", "IsNaN", "ReduceSum"} & seen[True], seen[True]

    pool = lambda t: nn.functional.max_pool2d(t, 2) * 2  # noqa: E731
    y = torch.randn(1, 2, 8, 8)
    y[0, 1, 3, 3] = math.nan
    with torch.no_grad():
        got = compile_ort(pool, fast_math=True)(y)
    expected = pool(y)
    assert_ran_on_ort()
    clean = ~expected.isnan()
    assert int((~clean).sum()) == 1
    assert torch.equal(got[clean], expected[clean])


class _Scaled(nn.Module):
    """sigmoid(w * x): a weight, so its inference graph shares it with ORT (the models kept in
    this process are those without weight data)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.w * x)


@pytest.mark.parametrize("disk", [False, True], ids=["in-process", "disk-cache"])
def test_exact_and_fast_models_never_share_a_cache_entry(disk: bool, tmp_path) -> None:
    """The same module compiled exact, fast, exact again (the in-process model cache; with
    ``cache_dir``, the disk cache): each gets its own model, as the tail at -30 shows."""
    model = _Scaled().eval()
    x = torch.tensor([-30.0, -1.0, 0.5, 3.0])
    cache = {"cache_dir": str(tmp_path)} if disk else {}
    with torch.no_grad():
        first = compile_ort(model, **cache)(x)
        fast = compile_ort(model, fast_math=True, **cache)(x)
        again = compile_ort(model, **cache)(x)
        expected = model(x)
    assert_ran_on_ort(3)
    assert torch.equal(first, expected) and torch.equal(again, expected)
    assert float(fast[0]) == 0.0 < float(expected[0])
    assert_close(fast[1:], expected[1:], rtol=0, atol=1e-6)


def test_explain_reports_the_accuracy() -> None:
    import ort_lazy

    torch.manual_seed(0)
    report = ort_lazy.explain(_Gated().eval(), torch.randn(4, 16), fast_math=True)
    assert report.accuracy is not None and report.accuracy["precision"] == "fp32 with fast_math"
    assert report.accuracy["max_abs_error"] < 1e-6
    assert "fp32 with fast_math" in str(report)

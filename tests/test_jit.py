"""torch.jit.script / trace graphs on ORT through the bridge, compared with eager PyTorch."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from helpers import bridge_marks, run_in_threads
from ort_lazy import metrics

pytestmark = bridge_marks()


@pytest.fixture
def ort_jit():
    import ort_lazy.jit

    with ort_lazy.jit.enable() as handle:
        yield handle


def _seed(x: torch.Tensor) -> torch.Tensor:
    y = x * x
    z = y + x
    p = z * x
    q = p - x
    return q / x


def _fresh_seed():
    """A new scripted seed function with its own executor (torch.jit.script caches per function)."""

    def seed(x: torch.Tensor) -> torch.Tensor:
        y = x * x
        z = y + x
        p = z * x
        q = p - x
        return q / x

    return torch.jit.script(seed)


def _calls_until_ort(fn, *args, calls: int = 4):
    """Call ``fn`` ``calls`` times; return the results and ort_runs after each call."""
    results, runs = [], []
    for _ in range(calls):
        results.append(fn(*args))
        runs.append(metrics.counters()["ort_runs"])
    return results, runs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32])
def test_script_no_grad_runs_on_ort(ort_jit, dtype):
    fn = _fresh_seed()
    data = [1, -1, 3] if not dtype.is_floating_point else [-1.0, 1.0, 2.5]
    x = torch.tensor(data, dtype=dtype)
    results, runs = _calls_until_ort(fn, x)
    expected = _seed(x)
    for r in results:
        assert r.dtype == expected.dtype
        assert torch.allclose(r, expected, equal_nan=True)
    # the profiling executor optimizes after the first call: from then on every call is ORT
    assert runs[-1] - runs[-2] == 1, runs
    graph = torch.jit.last_executed_optimized_graph()
    assert "ort::CompilationGroup" in str(graph)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32])
def test_seed_runs_whole_on_ort(ort_jit, dtype):
    """Every op of the seed (x * x reads one value twice) is in the ORT group: none is left
    behind in TorchScript."""
    fn = _fresh_seed()
    x = torch.tensor([1, -1, 3] if not dtype.is_floating_point else [-1.0, 1.0, 2.5], dtype=dtype)
    _calls_until_ort(fn, x, calls=3)
    assert metrics.fallbacks() == {}, metrics.fallbacks()
    top = str(torch.jit.last_executed_optimized_graph()).split("with ort::CompilationGroup")[0]
    assert "aten::" not in top, top


def test_ops_reading_one_value_twice_run_on_ort(ort_jit):
    """A node whose inputs are one value twice (x * x, x / x, x ** x, x + x) is probed with
    one example per input position, and runs on ORT."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * x + x / x + torch.pow(x, x) + torch.add(x, x, alpha=2) - torch.maximum(x, x)

    fn = torch.jit.script(f)
    x = torch.rand(5) + 0.5
    for _ in range(3):
        out = fn(x)
    assert torch.allclose(out, f(x))
    assert metrics.fallbacks() == {}, metrics.fallbacks()
    assert metrics.counters()["ort_runs"] > 0
    top = str(torch.jit.last_executed_optimized_graph()).split("with ort::CompilationGroup")[0]
    assert "aten::" not in top, top


def test_nodes_the_fusion_pass_turns_down_are_counted(ort_jit):
    """A node the bridge's C++ fusion predicate turns down before asking Python (several
    outputs, a scalar input computed in the graph, a non-tensor output) is a fallback with its
    reason in metrics, like every other op left to TorchScript; the rest still runs on ORT."""
    import torch.nn.functional as F

    from ort_lazy.reasons import Reason

    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        y, idx = F.max_pool2d_with_indices(x, 2)
        return torch.relu(y) * 2 + idx.float() + x.sum() * float(n)

    fn = torch.jit.script(f)
    x = torch.randn(1, 2, 8, 8)
    for _ in range(3):
        out = fn(x, 3)
    assert torch.equal(out, f(x, 3))
    assert metrics.counters()["ort_runs"] > 0
    fb = metrics.fallbacks()
    expected = {
        "aten.max_pool2d_with_indices.default": "several outputs",
        "aten.mul.Scalar": "a scalar input computed in the graph",
        "aten.Float.Scalar": "a non-tensor output",
    }
    for op, detail in expected.items():
        assert op in fb, fb
        (reason,) = fb[op]
        assert reason.startswith(Reason.UNFUSABLE) and detail in reason, reason


def test_script_with_grad_from_the_start(ort_jit):
    fn = _fresh_seed()
    for step in range(4):
        x = torch.tensor([-1.5, 0.5, 2.0, 3.0], requires_grad=True)
        y = fn(x)
        y.sum().backward()
        xe = x.detach().clone().requires_grad_()
        ye = _seed(xe)
        ye.sum().backward()
        assert torch.allclose(y, ye)
        assert torch.allclose(x.grad, xe.grad), step
    assert metrics.counters()["ort_runs"] > 0


def test_script_first_no_grad_then_grad(ort_jit):
    """A no-grad plan reused for requires_grad inputs must still give correct gradients."""
    fn = _fresh_seed()
    x = torch.tensor([-1.0, 1.0, 2.0, 4.0])
    for _ in range(3):
        fn(x)
    assert metrics.counters()["ort_runs"] > 0
    xg = x.clone().requires_grad_()
    for _ in range(3):
        xg.grad = None
        y = fn(xg)
        assert y.requires_grad
        y.sum().backward()
        assert torch.allclose(xg.grad, 2 * x + 1)
    # under no_grad the plan keeps using ORT
    before = metrics.counters()["ort_runs"]
    with torch.no_grad():
        assert torch.allclose(fn(xg), _seed(x))
    assert metrics.counters()["ort_runs"] == before + 1


def test_trace_multi_output(ort_jit):
    def two(x, w):
        h = torch.matmul(x, w)
        return torch.relu(h), torch.sigmoid(h) * 2.0

    x, w = torch.randn(5, 3), torch.randn(3, 4)
    fn = torch.jit.trace(two, (x, w))
    for _ in range(3):
        a, b = fn(x, w)
    ea, eb = two(x, w)
    assert torch.allclose(a, ea, atol=1e-6) and torch.allclose(b, eb, atol=1e-6)
    assert metrics.counters()["ort_runs"] > 0


def test_unsupported_node_stays_in_torchscript(ort_jit):
    def f(x):
        y = x * 2.0 + 1.0
        z = torch.special.zeta(y, y)  # no ONNX mapping
        return z * y - 1.0

    fn = torch.jit.script(f)
    x = torch.rand(6) + 1.5
    for _ in range(3):
        out = fn(x)
    assert torch.allclose(out, f(x), equal_nan=True)
    graph = str(torch.jit.last_executed_optimized_graph())
    assert "ort::CompilationGroup" in graph
    top = graph.split("with ort::CompilationGroup")[0]
    assert "aten::special_zeta" in top  # outside every group
    assert metrics.counters()["ort_runs"] > 0
    assert "aten.special_zeta.default" in metrics.fallbacks()


def test_export_failure_falls_back_once_warned(ort_jit, monkeypatch, caplog):
    from ort_lazy.export import torchscript
    from ort_lazy.frontends import jit as jit_frontend

    def broken(*args, **kwargs):
        raise torchscript.TorchScriptExportError("injected export failure")

    monkeypatch.setattr(jit_frontend, "export_torchscript", broken)

    def f(x):
        return torch.tanh(x) * x - 3.0

    fn = torch.jit.script(f)
    x = torch.randn(7)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        for _ in range(4):
            assert torch.allclose(fn(x), f(x))
    c = metrics.counters()
    assert c["export_failures"] == 1
    assert c["ort_runs"] == 0
    assert c["torch_runs"] >= 3
    warnings = [r for r in caplog.records if "injected export failure" in r.getMessage()]
    assert len(warnings) == 1


def test_session_failure_falls_back(ort_jit, monkeypatch, caplog):
    from ort_lazy.runtime import region
    from ort_lazy.runtime.session_create import OrtRunError

    class Broken:
        def __init__(self, *args, **kwargs):
            raise OrtRunError("injected session failure")

    monkeypatch.setattr(region, "OrtRunner", Broken)

    def f(x):
        return torch.exp(x) / (x * x + 1.0)

    fn = torch.jit.script(f)
    x = torch.randn(9)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        for _ in range(4):
            assert torch.allclose(fn(x), f(x))
    c = metrics.counters()
    assert c["ort_failures"] == 1 and c["ort_runs"] == 0
    assert len([r for r in caplog.records if "injected session failure" in r.getMessage()]) == 1


def test_bfloat16_and_bool_never_crash(ort_jit):
    fn = _fresh_seed()
    x = torch.tensor([-1.0, 1.0, 2.0], dtype=torch.bfloat16)
    for _ in range(3):
        out = fn(x)
    assert torch.allclose(out, _seed(x))
    # bfloat16 Mul has no ORT CPU kernel: counted fallback, never a failed session
    assert metrics.counters()["fallback_ops"] > 0
    assert metrics.counters()["ort_failures"] == 0

    def logic(a, b):
        return (a * b + a) == b

    fb = torch.jit.script(logic)
    a, b = torch.tensor([True, False, True]), torch.tensor([True, True, False])
    for _ in range(3):
        out = fb(a, b)
    assert torch.equal(out, logic(a, b))
    c = metrics.counters()
    assert c["ort_failures"] == 0 and c["export_failures"] == 0


def test_disable_and_context_manager():
    import ort_lazy.jit

    assert not ort_lazy.jit.is_enabled()
    with ort_lazy.jit.enable():
        assert ort_lazy.jit.is_enabled()
        fn = _fresh_seed()
        x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
        for _ in range(3):
            fn(x)
        assert metrics.counters()["ort_runs"] > 0
    assert not ort_lazy.jit.is_enabled()
    before = metrics.counters()["ort_runs"]
    assert torch.allclose(fn(x), _seed(x))  # groups fused earlier now run in TorchScript
    assert metrics.counters()["ort_runs"] == before
    ort_lazy.jit.enable()
    try:
        assert ort_lazy.jit.is_enabled()
    finally:
        ort_lazy.jit.disable()
    assert not ort_lazy.jit.is_enabled()


@pytest.mark.slow
def test_8_threads_x_500_calls_through_the_bridge(ort_jit):
    """The C++ operator takes the GIL to call ORT: many threads at once stay correct, no deadlock."""
    fn = _fresh_seed()
    x0 = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for _ in range(3):  # profiling runs, then the fused plan
        fn(x0)
    def worker(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(500):
            x = torch.rand(4, generator=g) + 0.5
            torch.testing.assert_close(fn(x), _seed(x))

    run_in_threads(worker)
    assert metrics.counters()["ort_runs"] >= 8 * 500


_F = torch.nn.functional
_X64 = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
#: (function, inputs, op the graph leaves in TorchScript or None: all on ORT)
_DROPPED_ARGUMENTS = {
    "softmax to float64": (lambda a: torch.softmax(a, 1, dtype=torch.float64).neg().abs(), torch.randn(3, 5) * 4, "softmax"),
    "log_softmax to float64": (lambda a: torch.log_softmax(a, 0, dtype=torch.float64).neg().abs(), torch.randn(3, 5) * 4, "log_softmax"),
    "softmin to float64": (lambda a: _F.softmin(a, 1, dtype=torch.float64).neg().abs(), torch.randn(3, 5) * 4, "softmax"),
    "log_softmax float64 to float32": (lambda a: torch.log_softmax(a, 1, dtype=torch.float32).neg().abs(),
                                       torch.randn(3, 5, dtype=torch.float64) * 4, "log_softmax"),
    "softplus threshold": (lambda a: _F.softplus(a, 3, 0.2).neg().abs(), torch.linspace(-2, 2, 9), "softplus"),
    "softplus beta and threshold": (lambda a: _F.softplus(a, 0.5, 5).neg().abs(), torch.linspace(-20, 20, 9), "softplus"),
    "float64 addmm alpha and beta": (lambda a: torch.addmm(a, a, a.t(), alpha=0.6, beta=0.2).neg().abs(), _X64, "addmm"),
    "float64 hardswish": (lambda a: _F.hardswish(a).neg().abs(), _X64, "hardswish"),
    "float64 batch_norm eps": (lambda a: _F.batch_norm(a, a[0] * 0, a[0] * 0 + 0.01, eps=0.3).neg().abs(), _X64, "batch_norm"),
    "float64 batch_norm training eps": (lambda a: _F.batch_norm(a, None, None, training=True, eps=0.3).neg().abs(), _X64, "batch_norm"),
    "float64 layer_norm eps": (lambda a: _F.layer_norm(a, (4,), eps=0.3).neg().abs(), _X64, "layer_norm"),
    "var correction past the count": (lambda a: torch.var(a[:2], dim=0, correction=5).neg().abs(), _X64.float(), "var"),
    "std fractional correction": (lambda a: torch.std(a, dim=(1,), correction=1.3).neg().abs(), _X64.float(), "std"),
    # what the exporter does right stays on ORT
    "var unbiased": (lambda a: torch.var(a, 1, unbiased=True).neg().abs(), _X64.float(), None),
    "std correction 2": (lambda a: torch.std(a, dim=(0, 1), correction=2, keepdim=True).neg().abs(), _X64.float(), None),
    "float64 addmm": (lambda a: torch.addmm(a, a, a.t(), alpha=0.5, beta=2).neg().abs(), _X64, None),
    "float64 layer_norm exact eps": (lambda a: _F.layer_norm(a, (4,), eps=0.25).neg().abs(), _X64, None),
    "softmax to its own type": (lambda a: torch.softmax(a, 1, dtype=torch.float32).neg().abs(), torch.randn(3, 5) * 4, None),
    "softplus default threshold": (lambda a: _F.softplus(a, 2).neg().abs(), torch.linspace(-20, 20, 9), None),
}


@pytest.mark.parametrize("name", list(_DROPPED_ARGUMENTS))
def test_arguments_the_exporter_drops_stay_in_torchscript(ort_jit, name):
    """The TorchScript exporter computes ``softmax``/``log_softmax`` in the input's type and
    casts the result to ``dtype=`` (eager converts first: float64 results 1e-7 off), its
    ``softplus`` ignores ``threshold`` (eager returns x above it: 0.01 off at 0.2), and it holds
    float64 ``addmm``'s alpha/beta and the norms' eps in float32 attributes (and float64
    ``hardswish``'s constants in float32): 1e-9 to 3e-7 off; its variance truncates a
    fractional correction and divides by ``N - correction`` past the count (eager: by 0, so
    inf, where the exporter gave a positive number). Such nodes
    stay in TorchScript; the rest of the graph (two ops: one alone is not grouped) runs on ORT."""
    fn, x, kept = _DROPPED_ARGUMENTS[name]
    traced = torch.jit.trace(fn, (x,))
    expected = fn(x)
    with torch.no_grad():
        for _ in range(3):
            got = traced(x)
    assert got.dtype == expected.dtype
    if kept is None:
        assert metrics.fallbacks() == {}, metrics.fallbacks()
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(got, expected), (got - expected).abs().max()
        assert any(op.split(".")[1] == kept for op in metrics.fallbacks()), metrics.fallbacks()
    assert metrics.counters()["ort_runs"] > 0, metrics.report()


def test_scalar_type_codes_are_torchscript_s():
    """The ``dtype=`` codes the bridge passes are c10's ScalarType numbers."""
    from torch.onnx._internal.torchscript_exporter._type_utils import JitScalarType

    from ort_lazy.support.torchscript import _SCALAR_TYPES

    assert {code: JitScalarType.from_dtype(dtype) for code, dtype in _SCALAR_TYPES.items()} == {c: c for c in _SCALAR_TYPES}


def test_float64_export_without_shape_inference_still_runs_on_ort(ort_jit, monkeypatch):
    """If ONNX shape inference fails on a float64 export, the group is exported under the
    default dtype (as before float64 exports) and still runs on ORT, not in TorchScript."""
    import sys

    import onnx

    infer = onnx.shape_inference.infer_shapes

    def broken(*args, **kwargs):
        if sys._getframe(1).f_code.co_name == "_default_dtype_matters":
            raise RuntimeError("shape inference broke")
        return infer(*args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", broken)
    fn = _fresh_seed()
    x = torch.tensor([-1.0, 1.0, 2.5], dtype=torch.float64)
    results, runs = _calls_until_ort(fn, x)
    assert runs[-1] - runs[-2] == 1, runs
    assert results[-1].dtype == torch.float64 and torch.allclose(results[-1], _seed(x))
    assert metrics.counters()["export_failures"] == 0, metrics.report()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sigmoid_tails_are_eager_s(ort_jit, dtype):
    """ORT's CPU Sigmoid is an absolute approximation (0 below -18 in float32, -37 in float64):
    sessions of every front door get the exact form (``runtime/quirks.exact_sigmoid``), so
    ``log(sigmoid(x))`` is x far out, not -inf."""
    x = torch.linspace(-80, 30, 111, dtype=dtype)
    traced = torch.jit.trace(lambda t: torch.log(torch.sigmoid(t)) + F.silu(t), (x,))
    with torch.no_grad():
        for _ in range(3):
            got = traced(x)
    assert metrics.counters()["ort_runs"] > 0 and metrics.fallbacks() == {}, metrics.report()
    expected = torch.log(torch.sigmoid(x)) + F.silu(x)
    assert torch.allclose(got, expected, rtol=4 * torch.finfo(dtype).eps, atol=0), (got - expected).abs().max()


def test_fast_math_keeps_ort_s_sigmoid():
    """With ``fast_math`` the TorchScript groups' sessions keep ORT's own logistic (0 far in the
    negative tail, eager's within 1e-6 elsewhere) instead of the exact form above."""
    import ort_lazy.jit

    x = torch.tensor([-30.0, -2.0, 0.0, 2.0])
    traced = torch.jit.trace(lambda t: torch.sigmoid(t) * 2, (x,))
    with ort_lazy.jit.enable(fast_math=True), torch.no_grad():
        for _ in range(3):
            got = traced(x)
    assert metrics.counters()["ort_runs"] > 0 and metrics.fallbacks() == {}, metrics.report()
    expected = torch.sigmoid(x) * 2
    assert float(got[0]) == 0.0 < float(expected[0])
    assert torch.allclose(got[1:], expected[1:], rtol=0, atol=1e-6)

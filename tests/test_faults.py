"""Faults fall back to PyTorch (counted, warned once); bad inputs give eager's results or errors."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest
import torch

import forkserver
from helpers import ChannelsLastBlock, assert_close, assert_ran_on_ort, compile_ort
from ort_lazy import metrics, partition
from ort_lazy.export import cache as export_cache
from ort_lazy.export.fx import ExportError
from ort_lazy.runtime import session as session_mod
from ort_lazy.runtime.session_create import OrtRunError


def model(x):
    return torch.sin(x) * 2 + x


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "ort_lazy" and r.levelno == logging.WARNING]


def test_export_raises_falls_back(monkeypatch, caplog):
    def boom(*a, **k):
        raise ExportError("injected export failure")

    monkeypatch.setattr(export_cache, "export_graph", boom)
    x = torch.randn(6)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        f = compile_ort(model)
        assert_close(f(x), model(x))
        assert_close(f(x), model(x))
    c = metrics.counters()
    assert c["export_failures"] == 1 and c["ort_runs"] == 0 and c["torch_runs"] == 0
    msgs = [r.getMessage() for r in _warnings(caplog) if "injected export failure" in r.getMessage()]
    assert len(msgs) == 1 and "inference_fused_0" in msgs[0] and "aten.sin.default" in msgs[0]


def test_unexpected_export_bug_falls_back(monkeypatch):
    monkeypatch.setattr(export_cache, "export_graph", lambda *a, **k: {}["missing"])
    x = torch.randn(3)
    assert_close(compile_ort(model)(x), model(x))
    assert metrics.counters()["export_failures"] == 1


def test_session_creation_raises_falls_back(monkeypatch, caplog):
    def boom(*a, **k):
        raise OrtRunError("injected session failure")

    monkeypatch.setattr(session_mod, "create_session", boom)
    x = torch.randn(6)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        assert_close(compile_ort(model)(x), model(x))
    assert metrics.counters()["ort_failures"] == 1
    assert metrics.fallbacks()["aten.sin.default"] == {"ORT session or run failed": 1}
    assert sum("injected session failure" in r.getMessage() for r in _warnings(caplog)) == 1


def test_run_raises_falls_back_once_and_for_all(monkeypatch, caplog):
    calls = []

    def boom(self, binding, inputs):
        calls.append(1)
        raise RuntimeError("injected run failure")

    monkeypatch.setattr(session_mod.OrtRunner, "_run", boom)
    f = compile_ort(model)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        for _ in range(3):
            x = torch.randn(6)
            assert_close(f(x), model(x))
    assert len(calls) == 1  # the region stays in PyTorch after the first failure
    c = metrics.counters()
    assert c["ort_failures"] == 1 and c["torch_runs"] == 2
    assert sum("injected run failure" in r.getMessage() for r in _warnings(caplog)) == 1


def _ort_allocates_every_symbolic_output(monkeypatch):
    """Outputs whose dims the inputs give are torch-allocated; make ORT allocate them instead."""
    real = session_mod._output_shapes

    def none(model):
        symbol_at, shapes = real(model)
        return {}, [None] * len(shapes)

    monkeypatch.setattr(session_mod, "_output_shapes", none)


def test_wrong_shaped_output_ort_allocates_is_caught(monkeypatch):
    _ort_allocates_every_symbolic_output(monkeypatch)
    real = session_mod._from_ortvalue

    def wrong(value, dtype):
        return real(value, dtype)[:-1]  # ORT "returns" one element too few

    monkeypatch.setattr(session_mod, "_from_ortvalue", wrong)
    torch._dynamo.reset()
    f = torch.compile(model, backend="ort", dynamic=True)  # symbolic output
    x = torch.randn(5)
    assert_close(f(x), model(x))
    assert metrics.counters()["ort_failures"] == 1


def test_wrong_shaped_output_buffer_is_caught(monkeypatch):
    """A torch-allocated output whose shape differs from what ORT computes: ORT refuses the
    buffer, the region falls back (never a result read from a wrong-sized buffer)."""
    real = session_mod._output_shapes

    def short(model):
        symbol_at, shapes = real(model)
        wrong = [None if f is None else (lambda symbols, f=f: [d - 1 for d in f(symbols)]) for f in shapes]
        return symbol_at, wrong

    monkeypatch.setattr(session_mod, "_output_shapes", short)
    torch._dynamo.reset()
    f = torch.compile(model, backend="ort", dynamic=True)  # symbolic output: torch allocates it
    x = torch.randn(5)
    assert_close(f(x), model(x))
    assert metrics.counters()["ort_failures"] == 1


def test_wrong_translation_caught_by_inferred_shapes(monkeypatch):
    """torchlib's flash-attention logsumexp has the wrong shape (ort-lazy translates the op
    itself); put back in its place, the export check refuses it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ort_lazy import _compat
    from ort_lazy.export.fx import export_graph

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    registry = _compat.onnx_registry()
    own = registry.get_decomps

    def library_first(op, *args, **kwargs):
        decomps = own(op, *args, **kwargs)
        return [d for d in decomps if not d.is_custom] if op is flash else decomps

    monkeypatch.setattr(registry, "get_decomps", library_first)

    def attn(q, k, v):
        return flash(q, k, v)

    q = torch.randn(2, 4, 16, 8)
    gm = make_fx(attn, tracing_mode="fake")(q, q, q)
    with pytest.raises(ExportError, match="inferred shape"):
        export_graph(gm, "attn")


def test_compile_fault_runs_graph_in_pytorch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("injected partitioner bug")

    monkeypatch.setattr(partition, "_node_reasons", boom)
    x = torch.randn(4)
    assert_close(compile_ort(model)(x), model(x))
    c = metrics.counters()
    # a partitioner fault is a compile failure, not an export failure
    assert c["compile_failures"] == 1 and c["export_failures"] == 0 and c["ort_runs"] == 0


def test_missing_onnxruntime_gives_clear_import_error():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["onnxruntime"] = None  # as if it were not installed
        import torch
        try:
            torch.compile(lambda x: x + 1, backend="ort")(torch.ones(1))
        except Exception as e:
            text = str(e)
            assert "pip install onnxruntime" in text, text
            print("CLEAR")
        """
    )
    out = forkserver.run([sys.executable, "-c", code], timeout=300)  # its server never imports onnxruntime
    assert "CLEAR" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(0, 4),
        lambda: torch.tensor(3.0),
        lambda: torch.tensor([float("nan"), float("inf"), -float("inf")]),
        lambda: torch.randn(4, 6).t()[1:, ::2],
    ],
    ids=["zero-size", "0-d", "nan-inf", "strided"],
)
def test_bad_inputs_match_eager(make):
    x = make()
    torch.testing.assert_close(compile_ort(model)(x), model(x), equal_nan=True)


def test_dtype_and_rank_changes_between_calls():
    f = compile_ort(model)
    for x in (torch.randn(3), torch.randn(3, 2), torch.randn(3, dtype=torch.float64), torch.arange(4)):
        torch.testing.assert_close(f(x), model(x))
    assert_ran_on_ort(4)


def test_requires_grad_toggling():
    f = compile_ort(model)
    x = torch.randn(5)
    assert_close(f(x), model(x))
    xg = x.clone().requires_grad_()
    out = f(xg)
    out.sum().backward()
    assert_close(xg.grad, torch.cos(x) * 2 + 1)
    assert_close(f(x), model(x))


def test_eager_errors_are_kept():
    def bad(x, y):
        return x @ y

    with pytest.raises(Exception, match="(?i)shape|size|mat"):
        compile_ort(bad)(torch.randn(2, 3), torch.randn(4, 5))


def test_inputs_on_mixed_devices_error_like_eager():
    def add(x, y):
        return x + y

    x, y = torch.randn(3), torch.randn(3, device="meta")
    with pytest.raises(Exception) as eager_error:
        add(x, y).cpu()
    with pytest.raises(Exception) as compiled_error:
        compile_ort(add)(x, y).cpu()
    assert "device" in str(eager_error.value).lower() and "device" in str(compiled_error.value).lower()


@pytest.mark.parametrize("failing", ["forward", "backward"])
def test_a_region_falling_back_reads_what_ort_regions_computed(monkeypatch, failing):
    """A region whose ORT run fails runs its PyTorch twin on the very inputs ORT got: tensors
    other regions computed on ORT, contiguous where the graph was traced with PyTorch's
    channels-last ones, which the twin's views need (they raised: the step crashed)."""
    real = session_mod.OrtRunner._run

    def fail_some(self, binding, inputs):
        if self.model.name.startswith(failing):
            raise RuntimeError("injected run failure")
        return real(self, binding, inputs)

    monkeypatch.setattr(session_mod.OrtRunner, "_run", fail_some)
    torch.manual_seed(0)
    block = torch.nn.Sequential(ChannelsLastBlock(), ChannelsLastBlock())
    ref = torch.nn.Sequential(ChannelsLastBlock(), ChannelsLastBlock())
    ref.load_state_dict(block.state_dict())
    x = torch.randn(2, 16, 6, 6)
    compiled = compile_ort(block)
    for _ in range(2):
        compiled(x).square().mean().backward()
        ref(x).square().mean().backward()
    for (name, p), q in zip(block.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5), name
    c = metrics.counters()
    assert c["ort_failures"] >= 1 and c["torch_runs"] >= 1 and c["ort_runs"] >= 1, c

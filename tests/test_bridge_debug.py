"""Run types and dumps on the bridge front doors (torch.jit and LazyTensor)."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

from helpers import bridge_marks
from ort_lazy import metrics
from ort_lazy.runtime import session as session_mod

pytestmark = bridge_marks()


def _scripted():
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 3 + x * x

    return torch.jit.script(f)


def _eager(x):
    return torch.tanh(x) * 3 + x * x


def _run_jit(calls=4, **options):
    import ort_lazy.jit

    fn = _scripted()
    x = torch.randn(6)
    with ort_lazy.jit.enable(**options):
        outs = [fn(x) for _ in range(calls)]
    for out in outs:
        torch.testing.assert_close(out, _eager(x))


def test_jit_pytorch_run_type_keeps_groups_in_torchscript():
    _run_jit(run_type="pytorch")
    c = metrics.counters()
    assert c["ort_runs"] == 0 and c["torch_runs"] > 0 and c["regions_compiled"] > 0


def test_jit_debug_run_type_compares_and_times_both():
    _run_jit(run_type="debug")
    assert metrics.counters()["ort_runs"] > 0
    names = metrics.timings()
    assert any(k.startswith("debug_torch:") for k in names) and any(k.startswith("run:") for k in names)


def test_jit_debug_catches_injected_wrong_result(monkeypatch):
    real = session_mod.OrtRunner._run

    def wrong(self, binding, inputs):
        outs = real(self, binding, inputs)
        outs[0].view(-1)[1] += 0.5
        return outs

    monkeypatch.setattr(session_mod.OrtRunner, "_run", wrong)
    with pytest.raises(Exception, match=r"mismatch at \(1,\)"):
        _run_jit(run_type="debug")


def test_jit_dump_dir(tmp_path):
    _run_jit(dump_dir=str(tmp_path))
    (path,) = tmp_path.glob("*.onnx")
    onnx.checker.check_model(onnx.load(str(path)))
    graph_text = path.with_suffix(".graph.txt").read_text()
    assert "aten::tanh" in graph_text  # the TorchScript IR of the group
    schema = json.loads(path.with_suffix(".schema.json").read_text())
    assert schema["inputs"][0]["dtype"] == "float32"


@pytest.mark.parametrize("run_type", ["pytorch", "debug"])
def test_lazy_run_types(run_type):
    import torch._lazy

    import ort_lazy

    was_on = ort_lazy.lazy.is_initialized()
    ort_lazy.lazy.init(run_type=run_type)
    try:
        x_cpu = torch.tensor([-1.0, 1.0, 2.0, 3.0])
        for _ in range(4):  # the profiling executor switches to the fused plan after warm-up
            out = _eager(x_cpu.to("lazy"))
            torch._lazy.mark_step()
            torch.testing.assert_close(out.cpu(), _eager(x_cpu))
    finally:
        # leave LazyTensor as this worker had it (other tests share the process-wide pass)
        ort_lazy.lazy.init() if was_on else ort_lazy.lazy.shutdown()
    c = metrics.counters()
    if run_type == "pytorch":
        assert c["ort_runs"] == 0 and c["torch_runs"] > 0
    else:
        assert c["ort_runs"] > 0 and any(k.startswith("debug_torch:") for k in metrics.timings())

"""Models on ONNX Runtime's OpenVINO execution provider: eager's numbers, OpenVINO really ran.

Runs where the installed onnxruntime has ``OpenVINOExecutionProvider`` (the OpenVINO flavour,
``python build.py --use_openvino``; OpenVINO's CPU device works on Intel and AMD CPUs); skipped
elsewhere. ``.ci/run`` runs this file in that flavour's own environment.

Per model (inference, float32, the zoo's small random-weight configs and bounds):

- outputs match eager (``rtol=1e-4``, ``atol`` 1e-5 of the largest |value|);
- ORT ran, nothing failed, no op is left to PyTorch (every op the CPU provider runs runs here);
- OpenVINO took the nodes: ORT's own assignment record gives it at least 90% of the ONNX nodes,
  and ORT's profiler at least 90% of the kernel time of the runs;
- training graphs run on ORT's CPU provider (OpenVINO's reader takes inference graphs only),
  with eager's loss and gradients.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
import torch
from test_zoo import _assert_training_parity
from zoo_runs import inference, training

from helpers import assert_close
from ort_lazy import metrics

OPENVINO = "OpenVINOExecutionProvider"


def _openvino_available() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return OPENVINO in onnxruntime.get_available_providers()


pytestmark = pytest.mark.skipif(
    not _openvino_available(),
    reason="the installed onnxruntime has no OpenVINOExecutionProvider (the OpenVINO flavour: python build.py --use_openvino)",
)

#: ORT's profiler writes here (one file per session); a folder of this process
PROFILE_DIR = os.path.join(tempfile.gettempdir(), f"ort-lazy-openvino-{os.getpid()}")

#: the options of every run here: OpenVINO first, ORT's CPU provider for what it leaves
ON_OPENVINO: tuple[tuple[str, Any], ...] = (
    ("providers", "openvino,cpu"),
    ("session_options", json.dumps({"enable_profiling": True, "profile_file_prefix": os.path.join(PROFILE_DIR, "run")})),
)

MODELS = ["bert", "gpt2", "llama", "vit", "resnet"]


def _share(counts: dict[str, float]) -> float:
    total = sum(counts.values())
    return counts.get(OPENVINO, 0.0) / total if total else 0.0


@pytest.mark.parametrize("name", MODELS)
def test_inference_on_openvino(name: str) -> None:
    os.makedirs(PROFILE_DIR, exist_ok=True)
    from ort_lazy.runtime.profile import kernel_time_by_provider

    run = inference(name, options=ON_OPENVINO)
    run.check()
    assert_close(run.actual, run.expected, rtol=1e-4, atol=1e-5)
    c = run.counters
    assert c["ort_runs"] > 0 and not (c["export_failures"] or c["ort_failures"] or c["compile_failures"]), run.report
    assert c["fallback_ops"] == 0, run.fallbacks
    assert "ONNX nodes per execution provider" in run.report and OPENVINO in run.report, run.report
    times = kernel_time_by_provider()
    assert _share(times) >= 0.9, times


def test_nodes_per_provider_are_counted_and_explained() -> None:
    """ORT's assignment record reaches the metrics and ``explain``: OpenVINO holds at least 90%
    of the nodes of a CNN with batch norm, pooling, a grouped convolution and hardswish."""
    from ort_lazy import explain

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, groups=2, padding=1), torch.nn.Hardswish(), torch.nn.AvgPool2d(2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4),
    ).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="ort", options={"providers": "openvino,cpu"})(x)
        report = explain(model, x, providers="openvino,cpu")
    assert_close(got, expected)
    nodes = metrics.ep_nodes()
    assert _share(nodes) >= 0.9, nodes
    assert _share(report.ep_nodes) >= 0.9, report.as_dict()
    assert "OpenVINO" in str(report), str(report)


def test_dynamic_sizes_on_openvino() -> None:
    """One model with symbolic dims serves several batch sizes and lengths on OpenVINO."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    compiled = torch.compile(layer, backend="ort", options={"providers": "openvino,cpu"})
    with torch.no_grad():
        for batch, length in ((2, 8), (3, 8), (3, 11), (5, 4)):
            x = torch.randn(batch, length, 32)
            assert_close(compiled(x), layer(x))
    c = metrics.counters()
    assert c["ort_runs"] >= 4 and c["fallback_ops"] == 0 and not c["ort_failures"], (c, metrics.fallbacks())
    assert _share(metrics.ep_nodes()) >= 0.9, metrics.ep_nodes()


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_training_runs_on_the_cpu_provider(name: str) -> None:
    """OpenVINO's reader refuses training forms: training graphs run on ORT's CPU provider
    (said once: ``partition.training_options``), with eager's loss, gradients and buffers
    (the zoo's bounds), every op ORT can run on ORT."""
    run = training(name, (("torch_preferred_ops", ()), ("providers", "openvino,cpu")))
    _assert_training_parity(run)
    assert run.counters["ort_runs"] > 0, run.report
    assert set(metrics.ep_nodes()) <= {"CPUExecutionProvider"}, metrics.ep_nodes()

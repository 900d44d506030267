"""Zoo models through LazyTensor (SGD steps, ``mark_step``) and TorchScript (``torch.jit.trace``).

LazyTensor: a CNN with max pooling and a small transformer (``nn.TransformerEncoderLayer``)
train 5 SGD steps on ``device="lazy"`` next to the same steps on CPU; every step's loss and the
final weights must match, ORT must run, and from the step on which the profiling executor
first optimizes the step's graph (the 3rd: step 1 and step 2 trace different graphs, step 2's
graph is fused when it runs again) every step runs on ORT. Two controls isolate what breaks:
the same CNN with average pooling, and a transformer block written with single-output ops.
Each model trains in its own process (``lazy_worker.py``): a crash in the bridge or in
TorchScript's fuser must not take the test run down.

TorchScript: the zoo's ResNet (and BERT, full zoo) traced with ``torch.jit.trace`` and run under
``ort_lazy.jit.enable()``: outputs match eager on every call and ORT runs.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchvision_stub import import_timm
from zoo import CASES

import ort_lazy
from helpers import assert_close, bridge_marks
from ort_lazy import metrics

pytestmark = bridge_marks()

STEPS = 5
#: the step (1-based) on which ORT first runs a LazyTensor training step, see the module doc
FIRST_ORT_STEP = 3
WORKER = Path(__file__).with_name("lazy_worker.py")


@functools.cache
def lazy_run(name: str) -> dict:
    """Train ``name`` in a fresh process on CPU and on LazyTensor; what the worker measured."""
    src = str(Path(ort_lazy.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {k: v for k, v in env.items() if not k.startswith("ORT_LAZY_")}
    proc = subprocess.run(
        [sys.executable, str(WORKER), name, str(STEPS)], capture_output=True, text=True, env=env, timeout=600
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"crashed": f"exit code {proc.returncode}: {proc.stderr[-3000:]}"}
    return json.loads(lines[-1])


def _param(name: str, full: bool = False):
    marks = [pytest.mark.zoo_full] if full else []
    return pytest.param(name, marks=marks, id=name)


def _completed(run: dict) -> dict:
    assert "crashed" not in run, run["crashed"]
    lazy = run["lazy"]
    assert lazy["error"] is None, f"step {lazy['error_step']} of {STEPS} raised {lazy['error']}\n{lazy.get('traceback', '')}"
    assert run["eager"]["error"] is None, run["eager"]
    return lazy


@pytest.mark.parametrize(
    "name",
    [
        _param("cnn_maxpool"),
        _param("transformer"),
        _param("cnn_avgpool", full=True),
        _param("transformer_block", full=True),
    ],
    scope="module",
)
def test_lazy_sgd_matches_cpu(name: str) -> None:
    run = lazy_run(name)
    lazy = _completed(run)
    eager = run["eager"]
    # float32, other kernels and reduction orders; 5 steps of SGD: measured <= 1e-7
    assert_close(torch.tensor(lazy["losses"]), torch.tensor(eager["losses"]), rtol=1e-4, atol=1e-6)
    for got, want in zip(lazy["params"], eager["params"]):
        assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    assert run["counters"]["ort_runs"] > 0, run["counters"]


@pytest.mark.parametrize(
    "name",
    [
        _param("cnn_maxpool"),
        _param("transformer"),
        _param("cnn_avgpool", full=True),
        _param("transformer_block", full=True),
    ],
    scope="module",
)
def test_lazy_steps_run_on_ort_from_the_third(name: str) -> None:
    run = lazy_run(name)
    lazy = _completed(run)
    runs = [0, *lazy["ort_runs"]]
    per_step = [b - a for a, b in zip(runs, runs[1:])]
    first = next((i + 1 for i, n in enumerate(per_step) if n), None)
    assert first == FIRST_ORT_STEP, per_step
    assert all(n > 0 for n in per_step[FIRST_ORT_STEP - 1 :]), per_step
    c = run["counters"]
    assert c["export_failures"] == 0 and c["ort_failures"] == 0, (c, run["fallbacks"])


# -- TorchScript ------------------------------------------------------------------------------


@functools.cache
def traced_run(name: str) -> dict:
    """``name`` traced in eval mode and called 4 times under ``ort_lazy.jit.enable()``."""
    import ort_lazy.jit

    case = CASES[name]
    if case.family == "timm":
        import_timm()
    else:
        pytest.importorskip("transformers")
    model = case.model().eval()
    inputs = case.inputs(torch.Generator().manual_seed(0))
    if case.family == "transformers":
        model.config.return_dict = False
    metrics.reset()
    with torch.no_grad():
        expected = model(**inputs)
        expected = expected[0] if isinstance(expected, tuple) else expected
        traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
        outputs, runs = [], []
        with ort_lazy.jit.enable():
            for _ in range(4):
                out = traced(**inputs)
                outputs.append(out[0] if isinstance(out, tuple) else out)
                runs.append(metrics.counters()["ort_runs"])
        graph = str(torch.jit.last_executed_optimized_graph())
    return {
        "expected": expected,
        "outputs": outputs,
        "ort_runs": runs,
        "groups": graph.count("ort::CompilationGroup"),
        "counters": metrics.counters(),
        "fallbacks": metrics.fallbacks(),
    }


@pytest.mark.parametrize("name", [_param("resnet"), _param("bert", full=True)], scope="module")
def test_traced_model_matches_eager(name: str) -> None:
    run = traced_run(name)
    for out in run["outputs"]:
        assert_close(out, run["expected"], rtol=1e-4, atol=1e-5)
    assert run["ort_runs"][-1] > 0 and run["groups"] > 0, run
    # the profiling executor has optimized the graph by the 3rd call: each call then runs ORT
    assert run["ort_runs"][-1] > run["ort_runs"][-2] > run["ort_runs"][-3], run["ort_runs"]
    c = run["counters"]
    assert c["export_failures"] == 0 and c["ort_failures"] == 0, c


@pytest.mark.parametrize("name", [_param("resnet")], scope="module")
def test_traced_cnn_convolutions_run_on_ort(name: str) -> None:
    """Convolution, batch norm and pooling have ONNX translations in the exporter the groups use."""
    run = traced_run(name)
    left = {op for op in run["fallbacks"] if op.split(".")[1] in ("_convolution", "batch_norm", "adaptive_avg_pool2d")}
    assert not left, run["fallbacks"]

"""Port of ONNX Runtime's LORT tests (``orttraining/orttraining/test/python/orttraining_test_lort.py``).

LORT ran LazyTensor's TorchScript backend with ORT registered as ``torch.jit``'s sub-executor
(``C.register_ort_as_torch_jit_executor()``); here that is ``ort_lazy.lazy.init()``. Models,
inputs, the 5 repetitions ("the first 1 or 2 runs of PyTorch JIT are eager mode") and the
tolerances are kept; each test also checks that ORT ran (``metrics``), which LORT's could not.

Dropped: ``ort.set_seed(1)`` (ORT's own random generator: nothing here draws from it).

Fixed while porting: like DORT's, LORT's MNIST test compared gradients through generators
over the parameters of one model that both runs had moved (``model.to(device)``), so it
compared the lazy gradients with themselves; here the lazy run trains a copy and the
gradients are materialized per run. The MNIST test runs in a process of its own
(``lort_worker.py``): a crash in the bridge or in TorchScript's fuser must not take the test
run down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ort_lazy
from helpers import bridge_marks
from ort_lazy import metrics

pytestmark = bridge_marks()


@pytest.fixture(scope="module")
def ltm():
    import torch._lazy

    ort_lazy.lazy.init()
    yield torch._lazy
    ort_lazy.lazy.shutdown()


def test_elementwise_model(ltm) -> None:
    torch.manual_seed(42)

    def elementwise_model(x):
        w = x.relu()
        y = w * w + 1.5
        z = y + x
        p = z * x
        q = p.relu()
        return q

    def run(fun, device, x):
        x = torch.tensor(x, device=device, dtype=torch.float32).requires_grad_()
        y = fun(x)
        y.sum().backward()
        return x, y, x.grad

    for _ in range(5):
        # Baseline.
        x, y, g_x = run(elementwise_model, "cpu", [-1.0, 2.0])
        # ORT result.
        x_new, y_new, g_x_new = run(elementwise_model, "lazy", [-1.0, 2.0])
        torch.testing.assert_close(x, x_new.cpu())
        torch.testing.assert_close(y, y_new.cpu())
        torch.testing.assert_close(g_x, g_x_new.cpu())
    c = metrics.counters()
    assert c["ort_runs"] > 0, metrics.report()
    assert c["export_failures"] == 0 and c["ort_failures"] == 0, metrics.report()


@pytest.mark.full
def test_mnist_model() -> None:
    src = str(Path(ort_lazy.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORT_LAZY_")}
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    worker = Path(__file__).with_name("lort_worker.py")
    proc = subprocess.run([sys.executable, str(worker)], capture_output=True, text=True, env=env, timeout=600)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit code {proc.returncode}: {proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert result["ok"], f"repetition {result['repetition']} of 5: {result['error']}\n{result.get('traceback', '')}"
    assert result["counters"]["ort_runs"] > 0, result["counters"]
    assert result["counters"]["export_failures"] == 0 and result["counters"]["ort_failures"] == 0, result["counters"]

"""Saved models checked the way a deployment uses them: loaded in a fresh process.

:func:`check_in_fresh_process` writes the calls to make and the outputs eager gave for them,
then starts an interpreter that imports torch and ort-lazy (its loader module too: with
``PYTHONDONTWRITEBYTECODE`` set, as on the development machines, each process would otherwise
compile it from source inside the clock), loads the artifact, makes the calls, and reports:
the seconds from ``ort_lazy.load`` to the first call's result (reading, verifying, onnxruntime's
import, sessions and the call), whether each output is within the zoo's bound of eager's (``rtol`` 1e-4, ``atol``
1e-5 of the largest |value|), ORT's run count, whether the direct path ran, and which modules
of dynamo and of the ONNX exporter were imported by then (none may be).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

ROOT = Path(__file__).resolve().parents[1]

#: seconds from ``ort_lazy.load`` to the first call's result, sessions included, on the
#: development machine (2 cores shared with other jobs)
LOAD_BUDGET_S = 0.5

#: module prefixes the load path must not import: the ONNX exporter and dynamo
FORBIDDEN_MODULES = ("onnxscript", "torch.onnx._internal.exporter", "torch._dynamo.eval_frame", "torch._dynamo.convert_frame")

CHILD = r"""
import json, sys, time
import torch, ort_lazy
import ort_lazy.runtime.artifact  # imported before the clock, as torch is (no bytecode cache here)
from torch.utils import _pytree as pytree
artifact, data = sys.argv[1], sys.argv[2]
calls = torch.load(data, weights_only=True)
start = time.perf_counter()
model = ort_lazy.load(artifact)
first = model(*calls[0]["args"], **calls[0]["kwargs"])
seconds = time.perf_counter() - start
forbidden = sorted(m for m in sys.modules if m.startswith(tuple(json.loads(sys.argv[3]))))
close = []
for i, call in enumerate(calls):
    out = first if i == 0 else model(*call["args"], **call["kwargs"])
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    ok = len(leaves) == len(call["expected"])
    for a, e in zip(leaves, call["expected"]):
        tol = max(1e-5, 1e-5 * float(e.abs().max())) if e.numel() else 1e-5
        ok = ok and a.shape == e.shape and a.dtype == e.dtype and bool(torch.allclose(a, e, rtol=1e-4, atol=tol))
    close.append(ok)
print("RESULT " + json.dumps({
    "load_first_s": seconds, "close": close, "ort_runs": ort_lazy.metrics.counters()["ort_runs"],
    "direct": model.direct, "forbidden": forbidden,
}))
"""


def plain_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of an output, in the order a loaded model returns them."""
    if hasattr(value, "keys") and not isinstance(value, dict):  # a ModelOutput: a dict once saved
        value = {k: value[k] for k in value.keys()}
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def eager_calls(model: torch.nn.Module, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each call (args, kwargs) with the outputs eager gives for it (eval mode, no grad)."""
    model.eval()
    out = []
    with torch.no_grad():
        for args, kwargs in calls:
            out.append({"args": args, "kwargs": kwargs, "expected": plain_leaves(model(*args, **kwargs))})
    return out


def env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORT_LAZY_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), environ.get("PYTHONPATH", "")])
    return environ


def load_in_fresh_process(artifact: Path, calls: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
    """Run :data:`CHILD` on ``artifact`` with ``calls``; its report."""
    data = workdir / f"{artifact.stem}_calls.pt"
    torch.save(calls, data)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(artifact), str(data), json.dumps(FORBIDDEN_MODULES)],
        capture_output=True, text=True, timeout=600, env=env(),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def check_in_fresh_process(artifact: Path, calls: list[dict[str, Any]], workdir: Path, *, direct: bool | None = None) -> dict[str, Any]:
    """Load ``artifact`` in a fresh process and assert: every call matches eager, ORT ran for
    each, nothing of dynamo or the exporter was imported, load and first call within
    :data:`LOAD_BUDGET_S` (the better of two processes: the machine is shared), and the path
    taken is ``direct`` when given. Returns the report."""
    report = load_in_fresh_process(artifact, calls, workdir)
    assert report["close"] == [True] * len(calls), report
    assert report["ort_runs"] >= len(calls), report
    assert report["forbidden"] == [], report
    if direct is not None:
        assert report["direct"] is direct, report
    if report["load_first_s"] > LOAD_BUDGET_S:
        again = load_in_fresh_process(artifact, calls, workdir)
        report["load_first_s"] = min(report["load_first_s"], again["load_first_s"])
    assert report["load_first_s"] <= LOAD_BUDGET_S, report
    return report

"""First-call figures of saved models: ``ort_lazy.load`` against ``torch.compile(backend="ort")``.

Per model, each in a fresh process (torch and ort-lazy imported before the clock starts):

* ``load+first``: ``ort_lazy.load(artifact)`` and the first call's result (sessions included);
* ``cold compile``: ``torch.compile(model, backend="ort")`` and its first call, no compile cache;
* ``warm compile``: the same with ``cache_dir`` holding a previous process's compile cache;

with the artifact's size and the machine's load average. ``--call-ratio`` times, in one
process, a loaded MLP's call (3 x 256, batch 32) against the best direct ORT run of the same
model (``best-ort``: ``torch.onnx.export(dynamo=True)``, IOBinding bound once, ORT's default
session options), in interleaved blocks: once as each runs by default, once both on one
thread. Run from the repository root::

    PYTHONPATH=src python benchmarks/save_load.py [--models mlp,bert,...] [--json out.json] [--call-ratio]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path[:0] = sys.argv[4:]
import torch, ort_lazy
import ort_lazy.runtime.artifact  # before the clock, as torch (no bytecode cache on the dev machines)
import saved_models
kind, name, where = sys.argv[1], sys.argv[2], sys.argv[3]
model, inputs, dynamic = saved_models.make(name)
if kind == "save":
    info = ort_lazy.save(model, inputs, where, dynamic_shapes=dynamic)
    print("RESULT " + json.dumps({"size": info["size"], "runs": info["runs"]}))
    raise SystemExit
with torch.no_grad():
    start = time.perf_counter()
    if kind == "load":
        fn = ort_lazy.load(where)
    else:
        options = {"cache_dir": where} if kind == "warm" else {}
        fn = torch.compile(model, backend="ort", options=options)
    fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)
    seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"seconds": seconds, "ort_runs": ort_lazy.metrics.counters()["ort_runs"]}))
"""


def _child(kind: str, name: str, where: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORT_LAZY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, kind, name, where, str(ROOT / "benchmarks"), str(ROOT / "tests" / "models"), str(ROOT / "tests")],
        capture_output=True, text=True, env=env, timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{kind} {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def call_ratio(blocks: int = 12, calls: int = 2000) -> dict[str, float]:
    """Median per-call microseconds of a loaded MLP and of ``best-ort``, and their ratio (the
    median of per-block ratios), by default and on one thread each."""
    import statistics
    import time

    import torch
    from _floor import export_floor

    import ort_lazy
    from ort_lazy.models import MLP

    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(32, 256)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.ortl")
        ort_lazy.save(model, (x,), path, dynamic_shapes=({0: torch.export.Dim("batch")},))
        for label, threads, options in (("default", torch.get_num_threads(), {}), ("one_thread", 1, {"session_options": {"intra_op_num_threads": 1}})):
            loaded = ort_lazy.load(path, **options)
            best = export_floor(model, (x,), threads, optimize=True, default_options=True)
            for _ in range(500):  # warm-up, and the loaded model's thread trial
                loaded(x)
                best()

            def block(fn: object) -> float:
                start = time.perf_counter()
                for _ in range(calls):
                    fn()  # type: ignore[operator]
                return (time.perf_counter() - start) / calls * 1e6

            ours, theirs = [], []
            for _ in range(blocks):
                ours.append(block(lambda loaded=loaded: loaded(x)))
                theirs.append(block(best))
            out[f"{label}_loaded_us"] = statistics.median(ours)
            out[f"{label}_best_ort_us"] = statistics.median(theirs)
            out[f"{label}_ratio"] = statistics.median(a / b for a, b in zip(ours, theirs))
            out[f"{label}_threads"] = loaded.regions["r0"].runner.threads or torch.get_num_threads()
    out["load_average"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,bert,gpt2,llama,resnet,vit,whisper,mixed")
    parser.add_argument("--repeat", type=int, default=2, help="fresh processes per figure (the best is kept)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--call-ratio", action="store_true", help="only the MLP's call against best-ort")
    args = parser.parse_args(argv)
    if args.call_ratio:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        result = call_ratio()
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            artifact = os.path.join(tmp, f"{name}.ortl")
            cache = os.path.join(tmp, f"{name}_cache")
            saved = _child("save", name, artifact)
            _child("warm", name, cache)  # fills the compile cache
            row = {"model": name, "size": saved["size"], "runs": saved["runs"]}
            for kind in ("load", "cold", "warm"):
                where = artifact if kind == "load" else cache
                row[kind] = min(_child(kind, name, where)["seconds"] for _ in range(args.repeat))
            row["load_average"] = os.getloadavg()[0]
            rows.append(row)
            print(
                f"{name:<8} {row['size'] / 1024:8.0f} KiB  load+first {row['load']:6.3f} s  cold compile {row['cold']:6.2f} s  "
                f"warm compile {row['warm']:6.2f} s  ({row['runs']}; load average {row['load_average']:.1f})",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

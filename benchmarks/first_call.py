"""First call of a compiled model in a new process: cold and with warm on-disk caches.

``bench.py`` times first calls inside one long process, after one-time imports. What a user
waits for when a program starts is the first call in a fresh process: imports, tracing,
compiling, and whatever the on-disk caches save. Each row here is a new Python process that
builds a built-in model (``ort_lazy.models.BUILTIN``), compiles it and times its first call
(``inference``: under ``torch.no_grad()``; ``train``: forward, ``out.square().mean()``,
``backward()``), run twice against one private cache directory per backend:

* ``ort``: ``torch.compile(model, backend="ort")`` with ``cache_dir`` (cold, then warm);
* ``inductor``: ``torch.compile(model)`` with ``TORCHINDUCTOR_CACHE_DIR`` (cold, then warm:
  its FX graph and AOTAutograd caches);
* ``dynamo``: ``torch.compile(model, backend="eager")``: dynamo's own share, which every
  backend pays (no cache).

Run: ``python benchmarks/first_call.py [--models mlp,transformer] [--modes inference,train]
[--json PATH]``. Times are wall seconds of the first call alone (imports of torch and
ort-lazy before it are reported apart); the machine is shared, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import ort_lazy
from ort_lazy.models import BUILTIN
imports = time.perf_counter() - t0
name, mode, backend, cache = sys.argv[1:5]
torch.manual_seed(0)
spec = BUILTIN[name]
model = spec.make()
inputs = spec.inputs()
if backend == "ort":
    fn = torch.compile(model, backend="ort", options={"cache_dir": cache})
elif backend == "inductor":
    fn = torch.compile(model)
else:
    fn = torch.compile(model, backend="eager")
start = time.perf_counter()
if mode == "train":
    model.train()
    fn(*inputs).float().square().mean().backward()
else:
    model.eval()
    with torch.no_grad():
        fn(*inputs)
first = time.perf_counter() - start
print(json.dumps({"imports_s": imports, "first_s": first,
                  "onnx_imported": "onnx" in sys.modules,
                  "exporter_imported": "torch.onnx._internal.exporter._core" in sys.modules}))
"""

BACKENDS = ("ort", "inductor", "dynamo")


def run_child(model: str, mode: str, backend: str, cache: Path, threads: int | None = None) -> dict[str, Any]:
    """One new process's first call of ``model`` (``mode``) on ``backend`` with ``cache``."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    env.pop("ORT_LAZY_CACHE_DIR", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model, mode, backend, str(cache / "ort")],
        capture_output=True, text=True, env=env, timeout=900,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(
    models: list[str], modes: list[str], threads: int | None = None, backends: tuple[str, ...] = BACKENDS
) -> list[dict[str, Any]]:
    """A row per model, mode and backend: the cold and the warm first call."""
    rows = []
    for model in models:
        for mode in modes:
            for backend in backends:
                with tempfile.TemporaryDirectory(prefix="ort-lazy-first-") as tmp:
                    cache = Path(tmp)
                    cold = run_child(model, mode, backend, cache, threads)
                    warm = run_child(model, mode, backend, cache, threads) if backend != "dynamo" else None
                rows.append({"model": model, "mode": mode, "backend": backend, "cold": cold, "warm": warm})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a table, with each backend's first calls over Inductor's."""
    def value(r: dict[str, Any] | None) -> float | None:
        return None if r is None or "error" in r else float(r["first_s"])

    index = {(r["model"], r["mode"], r["backend"]): r for r in rows}
    lines = [f"{'model':<12}{'mode':<11}{'backend':<10}{'cold s':>8}{'warm s':>8}{'cold/ind':>10}{'warm/ind':>10}{'imports s':>11}  notes"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        ind = index.get((r["model"], r["mode"], "inductor"))
        cold, warm = value(r["cold"]), value(r["warm"])
        ratios = []
        for mine, theirs in ((cold, value(ind["cold"]) if ind else None), (warm, value(ind["warm"]) if ind else None)):
            ratios.append(f"{mine / theirs:.2f}x" if mine is not None and theirs and r["backend"] != "inductor" else "-")
        notes = []
        for label, part in (("cold", r["cold"]), ("warm", r["warm"])):
            if part and "error" in part:
                notes.append(f"{label} failed: {part['error']}")
        if r["backend"] == "ort" and r["warm"] and "error" not in r["warm"]:
            notes.append("warm imports onnx" if r["warm"]["onnx_imported"] else "warm: no onnx import")
        imports = r["cold"].get("imports_s") if "error" not in r["cold"] else None
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(
            f"{r['model']:<12}{r['mode']:<11}{r['backend']:<10}{fmt(cold):>8}{fmt(warm):>8}{ratios[0]:>10}{ratios[1]:>10}"
            f"{fmt(imports):>11}  {'; '.join(notes)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,transformer", help="built-in models (ort_lazy.models.BUILTIN)")
    p.add_argument("--modes", default="inference,train")
    p.add_argument("--backends", default=",".join(BACKENDS), help="of " + ", ".join(BACKENDS))
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the children")
    p.add_argument("--json", default="", help="write the rows as JSON to this path")
    args = p.parse_args(argv)
    backends = tuple(args.backends.split(","))
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    rows = measure(args.models.split(","), args.modes.split(","), args.threads, backends)
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if any("error" in r["cold"] or (r["warm"] or {}).get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

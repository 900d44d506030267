"""ort-lazy benchmark suite: eager, Inductor, ``torch.compile(backend="ort")`` and the raw ORT floor.

Every selected model (by default the built-ins, :data:`ort_lazy.models.BUILTIN`) runs side by
side in one process, in each selected mode, on each selected row; the table, the targets, a JSON
file and a chart follow. This module is the command line; the suite itself is in its neighbours:

* :mod:`_rows`: the rows (eager, dynamo, Inductor, ort-lazy, the floor, the best direct ORT
  run, the rows of other execution providers, ...), how each is built and checked against eager;
* :mod:`_timing`: warm-up, rounds of interleaved timed calls, statistics;
* :mod:`_memory`: peak memory from the resident set size;
* :mod:`_report`: ratios between rows, the table, the JSON file and the chart;
* :mod:`_targets`: the project's targets and their check;
* :mod:`_floor`, :mod:`_models`: the ORT floor and the zoo of real models.

Run ``python benchmarks/bench.py --help`` for the options; ``ort-lazy bench`` calls :func:`main`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from _floor import export_floor, least_backend  # noqa: E402
from _memory import Rss  # noqa: E402
from _report import add_ratios, format_run, format_table, versions, write_json, write_png  # noqa: E402
from _rows import (  # noqa: E402
    BACKENDS,
    DEFAULT_BACKENDS,
    MODES,
    PROVIDERS,
    Backend,
    Case,
    Peer,
    Prepared,
    Provider,
    Row,
    default_backends,
    known_models,
    missing,
    provider_rows,
)
from _targets import TARGETS, Target, check_targets, format_targets  # noqa: E402
from _timing import prime, run_case, torch_configured  # noqa: E402

__all__ = [
    "main", "run_suite", "build_parser", "BACKENDS", "DEFAULT_BACKENDS", "MODES", "TARGETS", "Row", "Case", "Prepared",
    "Backend", "Target", "add_ratios", "check_targets", "default_backends", "export_floor", "format_table",
    "format_targets", "known_models", "least_backend", "missing", "run_case", "write_png", "PROVIDERS", "Peer", "Provider",
    "provider_rows",
]


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of the suite."""
    p = argparse.ArgumentParser(
        prog="ort-lazy bench",
        description="Eager PyTorch vs Inductor vs torch.compile(backend='ort') vs the raw ORT floor, side by side.",
    )
    from ort_lazy.models import BUILTIN

    p.add_argument("--models", default=",".join(BUILTIN),
                   help=f"comma-separated, from: {', '.join(known_models())} (default: the built-ins)")
    p.add_argument("--modes", default=",".join(MODES), help="inference, train or both (comma-separated)")
    p.add_argument("--backends", default=None,
                   help=f"comma-separated, from: {', '.join(BACKENDS)} (default: {', '.join(DEFAULT_BACKENDS)}, "
                   "less the CPU-only rows and with ort-fp16 on --device cuda, then the rows of each execution "
                   "provider installed (ort-openvino, best-ort-openvino; openvino where the openvino package is); "
                   "--freeze adds the +freeze rows)")
    p.add_argument("--reps", type=int, default=200, help="timed calls per row (fewer if --max-time runs out)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls per row after the first call")
    p.add_argument("--rounds", type=int, default=10, help="timed calls are interleaved across rows in this many rounds")
    p.add_argument("--max-time", type=float, default=5.0, help="seconds of timed calls per row, about (at least 5 calls)")
    p.add_argument("--pause-ms", type=float, default=50.0,
                   help="untimed pause before each row's share of a round, so the previous row's threads go idle")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads and ORT intra-op threads (default: torch's current count)")
    p.add_argument("--freeze", action="store_true", help="add ort+freeze (freeze_weights=True) and floor+freeze rows for inference")
    p.add_argument("--quick", action="store_true", help="few calls, for smoke tests (reps 20, warm-up 3, 2 rounds, 1 s)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument("--inductor-cache", action="store_true", help="leave Inductor's on-disk caches on (first call no longer cold)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed for weights and inputs")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where models and inputs live (cuda: ORT's CUDA provider; each timed call waits for the GPU; "
                   "the mixed-regime and int8 rows are CPU-only, the fp16 row GPU-only)")
    p.add_argument("--json", dest="json_path", default="bench-results.json", help="JSON output path ('' to skip)")
    p.add_argument("--png", dest="png_path", default="bench-results.png", help="PNG chart path ('' to skip)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the table and targets")
    return p


def run_suite(args: argparse.Namespace, log: Callable[[str], None]) -> tuple[list[Row], dict[str, Any]]:
    """Run every selected model, mode and backend; the rows (ratios filled) and run metadata."""
    models = _csv(args.models)
    modes = _csv(args.modes)
    backends = _csv(args.backends) if args.backends else default_backends(args.device)
    if args.freeze:
        backends += [b for b in ("ort+freeze", "floor+freeze") if b not in backends]
    for kind, chosen, known in (("model", models, known_models()), ("mode", modes, MODES), ("backend", backends, BACKENDS)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise SystemExit(f"unknown {kind}(s) {unknown}; choose from {', '.join(known)}")
    absent = {b: missing(b) for b in backends}
    absent = {b: why for b, why in absent.items() if why}
    if absent:  # a provider's rows where it is not installed: what to install, before anything runs
        raise SystemExit("; ".join(f"{b} cannot run here: {why}" for b, why in absent.items()))
    threads_before = torch.get_num_threads()
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    # ort-lazy follows torch's thread count itself (and uses one thread for small regions)
    ort_options: dict[str, Any] = {}
    try:
        with torch_configured(args.inductor_cache):
            return _run_models(args, models, modes, backends, threads, ort_options, log)
    finally:
        torch.set_num_threads(threads_before)


def _run_models(
    args: argparse.Namespace,
    models: list[str],
    modes: list[str],
    backends: list[str],
    threads: int,
    ort_options: dict[str, Any],
    log: Callable[[str], None],
) -> tuple[list[Row], dict[str, Any]]:
    catalogue = known_models()
    rss = Rss()
    started = time.perf_counter()
    prime_s = prime(backends, ort_options, log)
    rows: list[Row] = []
    for model_name in models:
        spec = catalogue[model_name]
        torch.manual_seed(args.seed)
        template = spec.make().to(args.device)
        inputs = tuple(t.to(args.device) for t in spec.inputs())
        for mode in modes:
            log(f"{model_name} / {mode}")
            torch._dynamo.reset()
            case = Case(model_name, mode, template, inputs, threads, ort_options, args.device)
            rows += run_case(
                case, backends, reps=args.reps, warmup=args.warmup, rounds=args.rounds,
                max_time_s=args.max_time, memory=not args.no_memory, rss=rss, log=log,
                pause_s=args.pause_ms / 1e3,
            )
            torch._dynamo.reset()
    add_ratios(rows)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": args.device if args.device == "cpu" else f"{args.device}: {torch.cuda.get_device_name()}",
        "threads": threads,
        "ort_options": ort_options,
        "reps": args.reps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "pause_ms": args.pause_ms,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "max_time_s": args.max_time,
        "models": models,
        "modes": modes,
        "backends": backends,
        "inductor_cache": bool(args.inductor_cache),
        "prime_s": prime_s,
        "wall_s": time.perf_counter() - started,
        "memory_method": "peak_mib = retained_mib (RSS growth from before the row was built to after its "
        "warm-up) + extra.call_peak_mib (peak RSS above the pre-call RSS over 3 steady-state calls, sampled "
        "every 0.2 ms from /proc/self/statm); readings after gc.collect() and malloc_trim(0)"
        if rss.available else "unavailable on this platform",
        "time_unit": "ms per call (median and p90 over the timed calls, after warm-up)",
    }
    return rows, meta


def main(argv: list[str] | None = None) -> int:
    """Run the suite; print the table, write JSON and PNG.

    Returns 0 when every row ran, 1 when some row failed (its error is in the table and JSON).
    """
    args = build_parser().parse_args(argv)
    if args.quick:
        args.reps, args.warmup, args.rounds, args.max_time = min(args.reps, 20), min(args.warmup, 3), 2, 1.0

    def log(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, meta = run_suite(args, log)
    targets = check_targets(rows)
    print(format_table(rows))
    print()
    print(format_targets(targets, informational=args.quick))
    print(format_run(meta))
    if args.json_path:
        path = Path(args.json_path)
        write_json(path, {**meta, "quick": bool(args.quick)}, rows, targets)
        print(f"JSON: {path}")
    if args.png_path:
        path = Path(args.png_path)
        if write_png(rows, path):
            print(f"chart: {path}")
        else:
            print("chart: skipped (matplotlib is not installed: pip install matplotlib)")
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

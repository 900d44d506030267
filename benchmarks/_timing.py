"""Timing the rows: the run's torch set-up, warm-up, rounds of interleaved calls, statistics.

The timed calls of all rows of one model and mode are interleaved in rounds, with an untimed
pause before each row's share of a round, so drift in machine load hits every row alike. Per
row: median, p90, mean and minimum per call, the first call (compile) time and peak memory
(:mod:`_memory`).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from _memory import Rss
from _rows import (
    BACKENDS,
    PROVIDERS,
    Case,
    Prepared,
    Row,
    check_against_eager,
    grad_mode,
    missing,
    peer_compile,
    peer_compiling,
    provider_rows,
)

__all__ = ["prime", "run_case", "torch_configured"]


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()


@contextlib.contextmanager
def torch_configured(inductor_cache: bool) -> Iterator[None]:
    """torch set up for the run, restored after it: dynamo's recompile limits raised (every
    model and mode recompiles) and, unless ``inductor_cache``, Inductor's caches off in a
    private directory (so its first call is cold). Nothing leaks into the caller's process."""
    import shutil
    import tempfile

    import torch._dynamo

    saved: list[tuple[Any, str, Any]] = []

    def set_(obj: Any, name: str, value: Any) -> None:
        if hasattr(obj, name):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            set_(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    env_before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    private_dir = None
    if not inductor_cache:
        # A private, empty cache directory: kernels compiled by an earlier run are not reused.
        private_dir = tempfile.mkdtemp(prefix="ort-lazy-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = private_dir
        with contextlib.suppress(Exception):
            import torch._inductor.config as inductor_config

            set_(inductor_config, "fx_graph_cache", False)
            set_(inductor_config, "force_disable_caches", True)
        with contextlib.suppress(Exception):
            import torch._functorch.config as functorch_config

            set_(functorch_config, "enable_autograd_cache", False)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        if private_dir is not None:
            if env_before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = env_before
            shutil.rmtree(private_dir, ignore_errors=True)


def prime(backends: Sequence[str], ort_options: dict[str, Any], log: Callable[[str], None]) -> dict[str, float]:
    """Compile a tiny model once per compiling backend so one-time imports are not billed to
    the first real model's first call (a provider's: its libraries, its peer's import)."""
    times: dict[str, float] = {}
    tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    # name -> (whether it is needed, how to compile, whether a training step is primed too, context)
    makers: dict[str, tuple[bool, Callable[[torch.nn.Module], Any], bool, Callable[[], Any]]] = {
        "inductor": ("inductor" in backends, lambda m: torch.compile(m), True, contextlib.nullcontext),
        "dynamo": ("dynamo" in backends, lambda m: torch.compile(m, backend="eager"), True, contextlib.nullcontext),
        "ort": (
            any(b.startswith("ort") or b.startswith("floor") for b in backends),
            lambda m: torch.compile(m, backend="ort", options=dict(ort_options)), True, contextlib.nullcontext,
        ),
    }
    for provider in PROVIDERS:
        rows = provider_rows(provider)
        own = [name for name in rows if provider.peer is None or name != provider.peer.name]
        if any(name in backends for name in own) and provider.needs() is None:
            options = {**ort_options, "providers": ",".join(provider.chain)}
            makers[f"ort-{provider.key}"] = (
                True, lambda m, o=options: torch.compile(m, backend="ort", options=o), False, contextlib.nullcontext,
            )
        peer = provider.peer
        if peer is not None and peer.name in backends and missing(peer.name) is None:
            makers[peer.name] = (True, lambda m, p=peer: peer_compile(p, m), False, lambda p=peer: peer_compiling(p))
    for name, (needed, make, train, context) in makers.items():
        if not needed:
            continue
        start = time.perf_counter()
        try:
            model = copy.deepcopy(tiny)
            compiled = make(model)
            with torch.no_grad(), context():
                compiled(x)
            if train:
                compiled(x).sum().backward()
        except Exception as e:
            log(f"  priming {name} failed: {_error_text(e)}")
        times[name] = time.perf_counter() - start
        torch._dynamo.reset()
    return times


def _time_calls(step: Callable[[], Any], n: int, train: bool, out: list[float]) -> None:
    clock = time.perf_counter
    with grad_mode(train):
        for _ in range(n):
            start = clock()
            step()
            out.append(clock() - start)


def _synchronized(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` followed by a wait for the GPU: a timed call covers the kernels it queued."""

    def call() -> Any:
        out = step()
        torch.cuda.synchronize()
        return out

    return call


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def run_case(
    case: Case,
    backends: Sequence[str],
    *,
    reps: int,
    warmup: int,
    rounds: int,
    max_time_s: float,
    memory: bool,
    rss: Rss,
    log: Callable[[str], None],
    pause_s: float = 0.05,
) -> list[Row]:
    """Build, warm up and time every backend on one model in one mode; one :class:`Row` each."""
    rows: list[Row] = []
    prepared: dict[str, Prepared] = {}
    per_call: dict[str, float] = {}
    for name in backends:
        backend = BACKENDS[name]
        if case.mode not in backend.modes:
            continue
        row = Row(case.model_name, case.mode, name)
        rows.append(row)
        base = rss.settle() if rss.available else 0
        stage = "build"
        try:
            if case.device not in backend.devices:
                raise ValueError(f"{name} is measured on {' and '.join(backend.devices)} only")
            p = backend.build(case)
            if case.device == "cuda":
                p.step = _synchronized(p.step)
            row.first_call_s = p.first_call_s
            row.note = p.note
            row.extra.update(p.extra)
            # Warm up; the warm-up also estimates the cost of a call for the time budget.
            stage = "warm-up"
            samples: list[float] = []
            _time_calls(p.step, max(1, warmup), case.train, samples)
        except Exception as e:
            row.status = "error"
            row.error = _error_text(e)
            row.extra["traceback"] = traceback.format_exc(limit=8)
            log(f"  {case.model_name}/{case.mode}/{name}: ERROR ({stage}) {row.error[:200]}")
            continue
        prepared[name] = p
        per_call[name] = statistics.median(samples[-max(1, warmup // 2):])
        if rss.available:
            row.retained_mib = max(0, rss.settle() - base) / 2**20
        log(f"  {case.model_name}/{case.mode}/{name}: first call {p.first_call_s:.3f} s, "
            f"~{per_call[name] * 1e3:.3f} ms/call {p.note}")

    by_name = {r.backend: r for r in rows}
    check_against_eager(prepared, by_name)
    if not prepared:
        return rows
    total_est = sum(per_call.values())
    n = max(min(reps, 5), min(reps, int(max_time_s * len(per_call) / max(total_est, 1e-9))))
    rounds = max(1, min(rounds, n))
    chunk = max(1, math.ceil(n / rounds))
    times: dict[str, list[float]] = {name: [] for name in prepared}
    for _ in range(rounds):
        for name, p in list(prepared.items()):
            # Untimed pause: worker threads of the previous row (ORT's spinning pool, OpenMP)
            # go idle before this row's calls are timed.
            time.sleep(pause_s)
            try:
                _time_calls(p.step, chunk, case.train, times[name])
            except Exception as e:
                row = by_name[name]
                row.status, row.error = "error", _error_text(e)
                row.extra["traceback"] = traceback.format_exc(limit=8)
                del prepared[name]
    for name, samples in times.items():
        row = by_name[name]
        if row.status != "ok" or not samples:
            continue
        row.calls = len(samples)
        row.median_ms = statistics.median(samples) * 1e3
        pre = row.extra.pop("pre_samples", None)
        if pre:  # a mixed row: its matmul's time in the timed calls
            row.extra["pre_ms"] = statistics.median(pre[-len(samples):]) * 1e3
            row.note += f" ({row.extra['pre_ms']:.3f} ms of it)"
        row.p90_ms = _percentile(samples, 0.9) * 1e3
        row.mean_ms = statistics.fmean(samples) * 1e3
        row.min_ms = min(samples) * 1e3

    if memory and rss.available:
        for name, p in prepared.items():
            row = by_name[name]
            try:
                base = rss.settle()
                with grad_mode(case.train), rss.peak() as peak:
                    for _ in range(3):
                        p.step()
                row.extra["call_peak_mib"] = max(0, peak[0] - base) / 2**20
                row.peak_mib = row.extra["call_peak_mib"] + (row.retained_mib or 0.0)
            except Exception as e:  # memory is a figure, not a reason to lose the row
                row.extra["memory_error"] = _error_text(e)
    prepared.clear()
    gc.collect()
    return rows

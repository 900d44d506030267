"""Counters and timings that show what ran where.

Tests and users read :func:`counters` to prove ORT really ran (``ort_runs`` > 0) and to see
what fell back to PyTorch and why.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "counters",
    "reset",
    "fallbacks",
    "ep_nodes",
    "record_ep_nodes",
    "timings",
    "report",
    "increment",
    "record_fallback",
    "record_time",
    "timed",
    "warn_once",
]

logger = logging.getLogger("ort_lazy")

_COUNTER_NAMES = (
    "ort_runs",
    "parked_runs",
    "torch_runs",
    "sessions_created",
    "session_cache_hits",
    "regions_compiled",
    "regions_on_ort",
    "fallback_ops",
    "fallback_regions",
    "compile_failures",
    "export_failures",
    "cleanup_failures",
    "ort_failures",
    "graphs_compiled",
    "ddp_uncompiled",
    "weight_refreshes",
    "weight_sets",
    "disk_cache_hits",
    "disk_cache_misses",
    "disk_cache_rejected",
    "stream_handoffs",
    "trt_profile_rebuilds",
    "check_fallbacks",
    "exact_form_switches",
    "fused_attention",
    "thread_trials",
    "autotune_kept_in_pytorch",
    "artifacts_saved",
    "artifacts_loaded",
)

_lock = threading.Lock()
_counters: collections.Counter[str] = collections.Counter()
_fallbacks: collections.Counter[tuple[str, str]] = collections.Counter()
_timings: dict[str, list[float]] = collections.defaultdict(list)
_warned: set[str] = set()
_MAX_SAMPLES = 10_000
# Per-region run-time series, appended to without a lock (deque.append is atomic).
_series: dict[str, collections.deque[float]] = {}


def series(name: str, maxlen: int = 2048) -> collections.deque[float]:
    """A bounded deque of timing samples (seconds) reported under ``name`` by :func:`timings`."""
    with _lock:
        existing = _series.get(name)
        if existing is None:
            existing = _series[name] = collections.deque(maxlen=maxlen)
        return existing


class _Ticker:
    """A hot-path counter: ``+1`` without a lock.

    ``self.value += 1`` is not atomic across threads in CPython, so each thread counts in its
    own slot (a dict keyed by thread id: a single store per call); the total is their sum.
    """

    __slots__ = ("_slots", "_base")

    def __init__(self) -> None:
        self._slots: dict[int, int] = {}
        self._base = 0

    def tick(self) -> None:
        slots = self._slots
        ident = threading.get_ident()
        slots[ident] = slots.get(ident, 0) + 1

    def total(self) -> int:
        return sum(list(self._slots.values())) - self._base

    def zero(self) -> None:
        self._base = sum(list(self._slots.values()))


_fast: dict[str, _Ticker] = {}


def ticker(name: str) -> Callable[[], None]:
    """A lock-free ``+1`` for counter ``name`` (for per-call paths); shown by :func:`counters`."""
    with _lock:
        counter = _fast.get(name)
        if counter is None:
            counter = _fast[name] = _Ticker()
    return counter.tick


def increment(name: str, amount: int = 1) -> None:
    """Add ``amount`` to counter ``name``."""
    with _lock:
        _counters[name] += amount


def record_fallback(op: str, reason: str, count: int = 1) -> None:
    """Count one op (``aten.mul.Tensor`` ...) left to PyTorch for ``reason``."""
    with _lock:
        _counters["fallback_ops"] += count
        _fallbacks[(op, reason)] += count


def record_time(name: str, seconds: float) -> None:
    """Keep one timing sample (seconds) under ``name``; bounded per name."""
    with _lock:
        samples = _timings[name]
        if len(samples) >= _MAX_SAMPLES:
            del samples[: _MAX_SAMPLES // 2]
        samples.append(seconds)


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Time the body and record it under ``name``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record_time(name, time.perf_counter() - start)


def warn_once(key: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
    """Log ``message`` (a warning unless ``level`` says otherwise) the first time ``key`` is
    seen (one per reason, not per call)."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.log(level, message, *args)


def counters() -> dict[str, int]:
    """A snapshot of all counters (always includes the standard names, zero when unused)."""
    with _lock:
        out = {name: 0 for name in _COUNTER_NAMES}
        out.update(_counters)
        for name, counter in _fast.items():
            out[name] = out.get(name, 0) + counter.total()
        return out


_ep_nodes: collections.Counter[str] = collections.Counter()


def record_ep_nodes(nodes: dict[str, int]) -> None:
    """Count the nodes each execution provider took in a session just created."""
    with _lock:
        _ep_nodes.update(nodes)


def ep_nodes() -> dict[str, int]:
    """Nodes per execution provider over every session created (ORT's node assignment:
    ``{"OpenVINOExecutionProvider": 41, "CPUExecutionProvider": 2}``); empty where the installed
    onnxruntime cannot say (before 1.23)."""
    with _lock:
        return dict(_ep_nodes)


def fallbacks() -> dict[str, dict[str, int]]:
    """Per op, how many times it was left to PyTorch for each reason."""
    with _lock:
        out: dict[str, dict[str, int]] = {}
        for (op, reason), n in sorted(_fallbacks.items()):
            out.setdefault(op, {})[reason] = n
        return out


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def timings() -> dict[str, dict[str, float]]:
    """Per timing name: count, total, p50, p90, p99 and max, in milliseconds."""
    with _lock:
        snapshot = {k: sorted(v) for k, v in _timings.items() if v}
        snapshot.update({k: sorted(v) for k, v in _series.items() if v})
    out = {}
    for name, values in sorted(snapshot.items()):
        out[name] = {
            "count": len(values),
            "total_ms": sum(values) * 1e3,
            "p50_ms": _percentile(values, 0.5) * 1e3,
            "p90_ms": _percentile(values, 0.9) * 1e3,
            "p99_ms": _percentile(values, 0.99) * 1e3,
            "max_ms": values[-1] * 1e3,
        }
    return out


def reset() -> None:
    """Zero every counter, fallback count and timing (warnings already given stay given)."""
    with _lock:
        _counters.clear()
        _fallbacks.clear()
        _ep_nodes.clear()
        _timings.clear()
        for values in _series.values():
            values.clear()
        for counter in _fast.values():
            counter.zero()


def report() -> str:
    """A readable text report of counters, fallbacks and timings."""
    lines = ["ort-lazy metrics", "counters:"]
    for name, value in sorted(counters().items()):
        lines.append(f"  {name:<22} {value}")
    placed = ep_nodes()
    if placed:
        total = sum(placed.values())
        lines.append("ONNX nodes per execution provider:")
        for provider, n in sorted(placed.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {provider:<30} {n} ({n / total:.0%})")
    fb = fallbacks()
    lines.append("ops left to PyTorch:" if fb else "ops left to PyTorch: none")
    for op, reasons in fb.items():
        for reason, n in reasons.items():
            lines.append(f"  {op:<40} {n:>6}  {reason}")
    tm = timings()
    lines.append("timings (ms):" if tm else "timings: none")
    for name, t in tm.items():
        lines.append(
            f"  {name:<28} n={t['count']:<6} p50={t['p50_ms']:.3f} p90={t['p90_ms']:.3f} "
            f"p99={t['p99_ms']:.3f} total={t['total_ms']:.1f}"
        )
    return "\n".join(lines)


def append_compile_record(record: dict[str, Any]) -> None:
    """Append one JSON line to ``ORT_LAZY_METRICS_FILE`` when it is set."""
    path = os.environ.get("ORT_LAZY_METRICS_FILE")
    if not path:
        return
    try:
        line = json.dumps(record, sort_keys=True, default=str)
        with _lock, open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except Exception as e:  # a metrics problem never changes what runs where, nor counts as a failure
        warn_once(f"metrics-file:{path}", "ort-lazy: cannot append to ORT_LAZY_METRICS_FILE=%s: %s", path, e)

"""Where ORT spends its kernel time, per execution provider, from ORT's own profiler.

Sessions made with ``session_options={"enable_profiling": True}`` (and, to choose where the
files go, ``"profile_file_prefix": "/tmp/run"``) record every node run;
:func:`kernel_time_by_provider` ends their profiling and sums the node times by the provider
that ran each node. A provider that compiles its share into one fused node (OpenVINO's
``OpenVINO-EP-subgraph_N``) counts as that node's time. Each session's profile ends at the first
call: profile again with new sessions (``ort_lazy.runtime.session_cache.session_cache().clear()``).
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable
from typing import Any

from .session_cache import session_cache

__all__ = ["kernel_time_by_provider", "profile_files", "read_profile"]


def profile_files(sessions: Iterable[Any] | None = None) -> list[str]:
    """End profiling on ``sessions`` (default: every cached session that profiles) and return
    the files ORT wrote."""
    if sessions is None:
        sessions = [entry[0] for entry in session_cache().values()]
    files = []
    for sess in sessions:
        options = sess.get_session_options()
        if not options.enable_profiling:
            continue
        path = sess.end_profiling()
        if path and os.path.isfile(path):
            files.append(path)
    return files


def read_profile(path: str) -> dict[str, float]:
    """Microseconds of node (kernel) time per execution provider in one ORT profile file."""
    with open(path) as f:
        events = json.load(f)
    totals: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        provider = (event.get("args") or {}).get("provider")
        if provider:
            totals[provider] += float(event.get("dur", 0))
    return dict(totals)


def kernel_time_by_provider(sessions: Iterable[Any] | None = None) -> dict[str, float]:
    """Microseconds of kernel time per execution provider over ``sessions`` (default: every
    cached session that profiles), ending their profiling: ``{"OpenVINOExecutionProvider":
    812.0, "CPUExecutionProvider": 9.5}``."""
    totals: collections.Counter[str] = collections.Counter()
    for path in profile_files(sessions):
        totals.update(read_profile(path))
    return dict(totals)

"""Reporting the rows: their ratios to one another, the text table, the JSON file and the chart.

Ratios are per model and mode: ``x eager``, ``x floor`` (``ort+freeze`` against ``floor+freeze``,
the ``ort`` training row against ``aot-eager``), ``x best`` (the best direct ORT run on the
row's provider: ``best-ort``, or a provider's ``best-ort-<name>``), ``x induct``, ``x ort``
(reduced-precision and fast_math rows against fp32 ``ort``), ``x peer`` (ort-lazy on a provider
against that provider's own ``torch.compile`` backend), the mixed regime's penalty, and the
first call and compile time against Inductor's. Below 1 is faster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _rows import BACKENDS, Row

__all__ = [
    "add_ratios", "format_run", "format_table", "ratio", "versions", "write_json", "write_png",
]


# ----------------------------------------------------------------------------- ratios


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def add_ratios(rows: Sequence[Row]) -> None:
    """Fill ``vs_eager``, ``vs_floor``, ``vs_inductor``, ``vs_best``, ``vs_peer``,
    ``mixed_penalty``, ``first_vs_inductor`` and ``compile_vs_inductor`` in place."""
    groups: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.mode), {})[r.backend] = r
    for group in groups.values():
        eager, inductor, dynamo = group.get("eager"), group.get("inductor"), group.get("dynamo")
        ort = group.get("ort")
        for r in group.values():
            if r.status != "ok":
                continue
            spec = BACKENDS.get(r.backend)
            best = group.get(spec.best if spec is not None else "best-ort")
            if best is not None and best.status == "ok" and r is not best:
                r.vs_best = ratio(r.median_ms, best.median_ms)
            peer = group.get(spec.peer) if spec is not None and spec.peer else None
            if peer is not None and peer.status == "ok":
                r.vs_peer = ratio(r.median_ms, peer.median_ms)
                if r.vs_peer is not None:
                    r.note += f"{', ' if r.note else ''}{r.vs_peer:.2f}x {peer.backend}'s time"
            alone = group.get(spec.alone) if spec is not None and spec.alone else None
            if alone is not None and alone.status == "ok" and r.median_ms is not None:
                r.mixed_penalty = ratio(r.median_ms - r.extra.get("pre_ms", 0.0), alone.median_ms)
                if r.mixed_penalty is not None:
                    r.note += f", penalty {r.mixed_penalty:.2f}x"
            if eager is not None and r is not eager:
                r.vs_eager = ratio(r.median_ms, eager.median_ms)
            if spec is not None and spec.reduced and ort is not None and ort.status == "ok":
                r.vs_ort = ratio(r.median_ms, ort.median_ms)
                if r.vs_ort is not None:
                    r.note += f"{', ' if r.note else ''}{1 / r.vs_ort:.2f}x fp32 ort's speed"
                if r.max_rel_diff is not None:
                    r.note += f", max rel error {r.max_rel_diff:.2%}"
            if inductor is not None and r is not inductor:
                r.vs_inductor = ratio(r.median_ms, inductor.median_ms)
                r.first_vs_inductor = ratio(r.first_call_s, inductor.first_call_s)
                compiles = r.backend not in ("eager", "dynamo") and not r.backend.startswith("floor")
                if compiles and dynamo is not None and dynamo.status == "ok" and inductor.status == "ok":
                    own = (r.first_call_s or 0.0) - (dynamo.first_call_s or 0.0)
                    r.compile_vs_inductor = ratio(max(own, 0.0), (inductor.first_call_s or 0.0) - (dynamo.first_call_s or 0.0))
            backend = BACKENDS.get(r.backend)
            floor_name = backend.floor_of.get(r.mode) if backend is not None else None
            floor = group.get(floor_name) if floor_name else None
            if floor is not None and floor.status == "ok":
                r.vs_floor = ratio(r.median_ms, floor.median_ms)


# ----------------------------------------------------------------------------- output


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec) + suffix


def format_table(rows: Sequence[Row]) -> str:
    """The results as a fixed-width text table."""
    header = ("model", "mode", "backend", "median ms", "p90 ms", "first s", "peak MiB",
              "x eager", "x floor", "x best", "x induct", "1st/ind", "cmp/ind", "max|diff|", "notes")
    lines = []
    for r in rows:
        if r.status != "ok":
            lines.append((r.model, r.mode, r.backend, "-", "-", _fmt(r.first_call_s, ".3f"), "-", "-", "-", "-", "-", "-", "-", "-",
                          f"ERROR {(r.error or '')[:90]}"))
            continue
        lines.append((
            r.model, r.mode, r.backend,
            _fmt(r.median_ms, ".3f"), _fmt(r.p90_ms, ".3f"), _fmt(r.first_call_s, ".3f"), _fmt(r.peak_mib, ".1f"),
            _fmt(r.vs_eager, ".2f", "x"), _fmt(r.vs_floor, ".2f", "x"), _fmt(r.vs_best, ".2f", "x"), _fmt(r.vs_inductor, ".2f", "x"),
            _fmt(r.first_vs_inductor, ".3f", "x"), _fmt(r.compile_vs_inductor, ".3f", "x"), _fmt(r.max_abs_diff, ".1e"), r.note,
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    right = set(range(3, 14))

    def render(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    out = [render(header), render(["-" * w for w in widths])]
    out += [render(line) for line in lines]
    return "\n".join(out)


def write_png(rows: Sequence[Row], path: Path) -> bool:
    """A bar chart of each row's time ratios (vs eager, and vs the floor); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups: list[tuple[str, str]] = []
    for r in rows:
        if (r.model, r.mode) not in groups:
            groups.append((r.model, r.mode))
    backends = [b for b in dict.fromkeys(r.backend for r in rows) if b != "eager"]
    index = {(r.model, r.mode, r.backend): r for r in rows}
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 1.1 * len(groups) + 3), 8), constrained_layout=True)
    panels = (("vs_eager", "time / eager (lower is faster)"), ("vs_best", "time / best direct ORT run on the row's provider (best-ort-<provider>: / best-ort)"))
    width = 0.8 / max(1, len(backends))
    labels = [f"{m}\n{mode}" for m, mode in groups]
    for ax, (field, title) in zip(axes, panels):
        for j, backend in enumerate(backends):
            values = []
            for model, mode in groups:
                row = index.get((model, mode, backend))
                value = getattr(row, field) if row is not None and row.status == "ok" else None
                values.append(value if value is not None else float("nan"))
            if all(math.isnan(v) for v in values):
                continue
            xs = [i + (j - (len(backends) - 1) / 2) * width for i in range(len(groups))]
            # one colour per backend in both panels (a panel skips the backends it has no ratio for)
            bars = ax.bar(xs, values, width, label=backend, color=f"C{j % 10}")
            for bar, v in zip(bars, values):
                if not math.isnan(v):
                    ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels)
        ax.set_title(title)
        ax.set_yscale("log")
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8)
    fig.suptitle("ort-lazy benchmark: median time per call as a ratio")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def versions() -> dict[str, str]:
    """The versions of Python, torch, onnxruntime (and its providers), ort-lazy and OpenVINO
    (those that import)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    with contextlib.suppress(Exception):
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    with contextlib.suppress(Exception):
        out["onnxruntime_providers"] = ",".join(onnxruntime.get_available_providers())
    with contextlib.suppress(Exception):
        import ort_lazy

        out["ort_lazy"] = ort_lazy.__version__
    if importlib.util.find_spec("openvino") is not None:
        with contextlib.suppress(Exception):
            import openvino

            out["openvino"] = openvino.__version__
    return out


def format_run(meta: dict[str, Any]) -> str:
    """The line after the targets: threads, versions, wall time and load average of the run."""
    return (f"threads={meta['threads']}  torch {meta['versions'].get('torch')}  onnxruntime "
            f"{meta['versions'].get('onnxruntime')}  wall {meta['wall_s']:.0f} s  load average "
            f"{' '.join(f'{x:.1f}' for x in meta['load_average'] or [])}")


def write_json(path: Path, meta: dict[str, Any], rows: Sequence[Row], targets: Sequence[dict[str, Any]]) -> None:
    """The run as JSON: ``{"meta": ..., "rows": [...], "targets": [...]}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows], "targets": targets}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")

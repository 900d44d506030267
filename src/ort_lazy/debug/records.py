"""What compilation decided, kept for ``ort_lazy.explain`` and the metrics file.

:func:`recording` collects a :class:`GraphRecord` for every graph compiled inside the block (the
partitioner fills them in); :class:`ExplainReport` turns them into the report users read.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..reasons import Reason, suggestion

__all__ = ["GraphRecord", "recording", "new_record", "record_failure", "mark", "ExplainReport"]


@dataclass
class GraphRecord:
    """What compilation decided for one graph."""

    tag: str
    ops: list[tuple[str, str | None]] = field(default_factory=list)  # (op, reason or None)
    regions: list[dict[str, Any]] = field(default_factory=list)
    #: why the whole graph runs in PyTorch, when compiling it failed
    failure: str | None = None


_recorders: list[list[GraphRecord]] = []


@contextlib.contextmanager
def recording() -> Iterator[list[GraphRecord]]:
    """Collect a :class:`GraphRecord` for every graph compiled inside the block."""
    records: list[GraphRecord] = []
    _recorders.append(records)
    try:
        yield records
    finally:
        _recorders.remove(records)


def new_record(tag: str) -> GraphRecord:
    """A record for a graph being compiled, handed to every active :func:`recording`."""
    record = GraphRecord(tag)
    for records in _recorders:
        records.append(record)
    return record


def record_failure(tag: str, text: str) -> None:
    """Record that the graph ``tag`` runs in PyTorch because compiling it failed."""
    for records in _recorders:
        for record in records:
            if record.tag == tag and record.failure is None and not record.regions:
                record.failure = text
                break
        else:
            records.append(GraphRecord(tag, failure=text))


def mark(record: GraphRecord, op: str, reason: str) -> None:
    """Change the first still-supported entry of ``op`` in ``record`` to ``reason``."""
    for i, (name, current) in enumerate(record.ops):
        if name == op and current is None:
            record.ops[i] = (name, reason)
            return


@dataclass
class ExplainReport:
    """Partitions, the share of ops on ORT, and every op left to PyTorch with its reason."""

    graphs: list[GraphRecord] = field(default_factory=list)

    @property
    def ops_total(self) -> int:
        return sum(len(g.ops) for g in self.graphs)

    @property
    def ops_on_ort(self) -> int:
        return sum(1 for g in self.graphs for _, r in g.ops if r is None)

    @property
    def share_on_ort(self) -> float:
        return self.ops_on_ort / self.ops_total if self.ops_total else 0.0

    @property
    def fallbacks(self) -> dict[str, dict[str, int]]:
        """op -> reason -> count, over every graph."""
        out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for g in self.graphs:
            for op, reason in g.ops:
                if reason is not None:
                    out[op][reason] += 1
        return {op: dict(c) for op, c in sorted(out.items())}

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops_total": self.ops_total,
            "ops_on_ort": self.ops_on_ort,
            "share_on_ort": self.share_on_ort,
            "graphs": [
                {"tag": g.tag, "regions": g.regions, "ops": len(g.ops), "failure": g.failure} for g in self.graphs
            ],
            "fallbacks": [
                {"op": op, "reason": reason, "count": n, "suggestion": suggestion(reason)}
                for op, reasons in self.fallbacks.items()
                for reason, n in reasons.items()
            ],
        }

    def __str__(self) -> str:
        lines = [
            f"ort-lazy explain: {self.ops_on_ort}/{self.ops_total} ops on ORT ({self.share_on_ort:.0%}), "
            f"{len(self.graphs)} graph(s)"
        ]
        for g in self.graphs:
            if g.failure is not None:
                lines.append(f"  graph {g.tag}: runs in PyTorch, compiling it failed: {g.failure}")
                lines.append(f"      fix: {suggestion(Reason.COMPILE_FAILED)}")
                continue
            on = sum(1 for r in g.regions if r["on_ort"])
            lines.append(f"  graph {g.tag}: {len(g.ops)} ops, {on}/{len(g.regions)} region(s) on ORT")
            for r in g.regions:
                where = "ORT" if r["on_ort"] else "PyTorch (failed on ORT)"
                tune = r.get("autotune")
                if tune:
                    where = "ORT" if tune["chosen"] == "ort" else "PyTorch (autotune)"
                    where += f"; autotune: ORT {tune['ort_ms']:.3f} ms vs PyTorch {tune['pytorch_ms']:.3f} ms"
                lines.append(f"    {r['name']}: {len(r['ops'])} ops on {where}")
        if self.fallbacks:
            lines.append("  left to PyTorch:")
            for op, reasons in self.fallbacks.items():
                for reason, n in reasons.items():
                    lines.append(f"    {op} x{n}: {reason}")
                    tip = suggestion(reason)
                    if tip:
                        lines.append(f"      fix: {tip}")
        else:
            lines.append("  nothing left to PyTorch")
        return "\n".join(lines)

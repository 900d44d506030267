"""What compilation decided, kept for ``ort_lazy.explain`` and the metrics file.

:func:`recording` collects a :class:`GraphRecord` for every graph compiled inside the block (the
partitioner fills them in); :class:`ExplainReport` turns them into the report users read.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..reasons import Reason, suggestion

__all__ = ["GraphRecord", "GraphBreak", "recording", "new_record", "record_failure", "mark", "is_compute", "ExplainReport"]


@dataclass
class GraphRecord:
    """What compilation decided for one graph."""

    tag: str
    ops: list[tuple[str, str | None]] = field(default_factory=list)  # (op, reason or None)
    regions: list[dict[str, Any]] = field(default_factory=list)
    #: why the whole graph runs in PyTorch, when compiling it failed
    failure: str | None = None
    #: what runs, in execution order: region entries (of ``regions``) and
    #: ``{"pytorch": [(op, reason), ...]}`` for the ops between them
    steps: list[dict[str, Any]] = field(default_factory=list)
    #: the dynamo graph (1-based, in the order dynamo captured them) this graph came from
    dynamo_graph: int | None = None


@dataclass
class GraphBreak:
    """A graph break: dynamo stopped capturing there and the code at it runs in Python."""

    reason: str
    file: str | None = None
    line: int | None = None
    #: the dynamo graph that ended at this break (None: no graph was captured before it)
    after_graph: int | None = None
    count: int = 1
    #: False: dynamo gave up on the whole frame (function) there, which runs in Python
    split: bool = True

    @property
    def summary(self) -> str:
        """The reason in one line: what dynamo could not trace, and its first hint."""
        lines = [ln.strip() for ln in self.reason.splitlines() if ln.strip()]
        if not lines:
            return "graph break"
        text = lines[0]
        explanation = next((ln[len("Explanation:") :].strip() for ln in lines if ln.startswith("Explanation:")), "")
        hint = next((ln[len("Hint:") :].strip() for ln in lines if ln.startswith("Hint:")), "")
        if explanation:
            text += f": {explanation}"
        if hint:
            text += f" (hint: {hint})"
        return text

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file and self.line else "(location unknown)"

    @property
    def code(self) -> str:
        """The source line at the break (what runs in Python), '' when unavailable."""
        if not self.file or not self.line:
            return ""
        import linecache

        return linecache.getline(self.file, self.line).strip()

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.summary,
            "file": self.file,
            "line": self.line,
            "code": self.code,
            "after_graph": self.after_graph,
            "count": self.count,
            "kind": "graph break" if self.split else "frame left to Python",
        }


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


def is_compute(op: str) -> bool:
    """Whether the aten op named ``op`` computes values (not a view, alias or detach: plumbing
    that moves no data, left out of the share on ORT)."""
    return op not in _PLUMBING and not _is_view(op)


_PLUMBING = {"aten._unsafe_view.default", "aten.lift_fresh_copy.default", "aten.alias_copy.default"}


@functools.lru_cache(maxsize=1024)
def _is_view(op: str) -> bool:
    from ..opnames import lookup

    target = lookup(op)
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return True
    # functionalized views (``aten.t_copy`` for ``aten.t``) move data no more than their views
    namespace, name, overload = (op.split(".") + [""])[:3]
    if name.endswith("_copy") and name != "_to_copy":
        return _is_view(f"{namespace}.{name[: -len('_copy')]}.{overload}")
    return False


@dataclass
class ExplainReport:
    """Partitions in execution order, the share of compute ops on ORT, every op left to
    PyTorch with its reason, and dynamo's graph breaks (code that runs in Python)."""

    graphs: list[GraphRecord] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    #: graphs dynamo captured (None: not known, e.g. a report built from records alone)
    dynamo_graphs: int | None = None
    #: with a reduced ``precision`` or ``fast_math``: how far the outputs are from eager PyTorch's
    #: (``precision``, ``max_abs_error``, ``max_rel_error`` = max abs error / max |eager|)
    accuracy: dict[str, Any] | None = None

    @property
    def ops_total(self) -> int:
        """Compute ops of every graph (views, detach and getitem plumbing left out)."""
        return sum(1 for g in self.graphs for op, _ in g.ops if is_compute(op))

    @property
    def ops_on_ort(self) -> int:
        return sum(1 for g in self.graphs for op, r in g.ops if r is None and is_compute(op))

    @property
    def share_on_ort(self) -> float:
        return self.ops_on_ort / self.ops_total if self.ops_total else 0.0

    @property
    def ep_nodes(self) -> dict[str, int]:
        """ONNX nodes per execution provider over every region on ORT (ORT's own assignment;
        empty where the installed onnxruntime cannot say)."""
        out: collections.Counter[str] = collections.Counter()
        for g in self.graphs:
            for region in g.regions:
                out.update(region.get("ep_nodes") or {})
        return dict(out)

    @property
    def fallbacks(self) -> dict[str, dict[str, int]]:
        """op -> reason -> count, over the compute ops of every graph."""
        out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for g in self.graphs:
            for op, reason in g.ops:
                if reason is not None and is_compute(op):
                    out[op][reason] += 1
        return {op: dict(c) for op, c in sorted(out.items())}

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops_total": self.ops_total,
            "ops_on_ort": self.ops_on_ort,
            "share_on_ort": self.share_on_ort,
            "ep_nodes": self.ep_nodes,
            "dynamo_graphs": self.dynamo_graphs,
            "accuracy": self.accuracy,
            "graph_breaks": [b.as_dict() for b in self.graph_breaks],
            "graphs": [
                {
                    "tag": g.tag,
                    "dynamo_graph": g.dynamo_graph,
                    "regions": g.regions,
                    "ops": sum(1 for op, _ in g.ops if is_compute(op)),
                    "failure": g.failure,
                    "steps": [_step_dict(s) for s in g.steps],
                }
                for g in self.graphs
            ],
            "fallbacks": [
                {"op": op, "reason": reason, "count": n, "suggestion": suggestion(reason)}
                for op, reasons in self.fallbacks.items()
                for reason, n in reasons.items()
            ],
        }

    def __str__(self) -> str:
        breaks = sum(b.count for b in self.graph_breaks if b.split)
        skipped = sum(b.count for b in self.graph_breaks if not b.split)
        head = f"ort-lazy explain: {self.ops_on_ort}/{self.ops_total} compute ops of the captured graphs on ORT ({self.share_on_ort:.0%})"
        if self.dynamo_graphs is None:
            head += f", {len(self.graphs)} graph(s)"
        else:
            # one dynamo graph may compile as several (forward, backward, higher-order op bodies)
            head += f", {self.dynamo_graphs} dynamo graph(s)"
            if len(self.graphs) != self.dynamo_graphs:
                head += f" compiled as the {len(self.graphs)} graphs below"
        if breaks:
            head += f", {breaks} graph break(s): the code at each runs in Python, not on ORT"
        if skipped:
            head += f", {skipped} function(s) dynamo left to Python (not on ORT)"
        lines = [head]
        placed = self.ep_nodes
        if placed and (len(placed) > 1 or "CPUExecutionProvider" not in placed):
            total = sum(placed.values())
            lines.append(
                "  ONNX nodes per execution provider (ORT's assignment): "
                + ", ".join(f"{p} {k} ({k / total:.0%})" for p, k in sorted(placed.items(), key=lambda kv: -kv[1]))
            )
        if self.accuracy is not None:
            a = self.accuracy
            lines.append(
                f"  precision {a['precision']}: outputs {a['max_abs_error']:.3g} from eager PyTorch at most "
                f"({a['max_rel_error']:.2%} of the largest |output|)"
            )
        if self.dynamo_graphs == 0:
            lines.append("  dynamo captured no graph: everything ran in Python / eager PyTorch")
        for b in self.graph_breaks:
            if b.after_graph is None:
                lines += _break_lines(b)
        for i, g in enumerate(self.graphs, 1):
            lines += _graph_lines(i, g)
            last = i == len(self.graphs) or self.graphs[i].dynamo_graph != g.dynamo_graph
            if last and g.dynamo_graph is not None:
                for b in self.graph_breaks:
                    if b.after_graph == g.dynamo_graph:
                        lines += _break_lines(b)
        shown = {g.dynamo_graph for g in self.graphs}
        for b in self.graph_breaks:  # after a graph with nothing to compile (no record)
            if b.after_graph is not None and b.after_graph not in shown:
                lines += _break_lines(b)
        if self.fallbacks:
            lines.append("  left to PyTorch:")
            for op, reasons in self.fallbacks.items():
                for reason, n in reasons.items():
                    lines.append(f"    {op} x{n}: {reason}")
                    tip = suggestion(reason)
                    if tip:
                        lines.append(f"      fix: {tip}")
        elif self.graphs:
            lines.append("  no compute op of the captured graphs left to PyTorch")
        return "\n".join(lines)


def _step_dict(step: dict[str, Any]) -> dict[str, Any]:
    if "pytorch" in step:
        return {"where": "pytorch", "ops": [{"op": op, "reason": r} for op, r in step["pytorch"] if is_compute(op)]}
    out = {"where": "ort" if step.get("on_ort") else "pytorch", "region": step.get("name")}
    if step.get("error"):
        out["error"] = step["error"]
    return out


def _graph_lines(index: int, g: GraphRecord) -> list[str]:
    name = f"graph {index} ({g.tag}" + (f", dynamo graph {g.dynamo_graph})" if g.dynamo_graph is not None else ")")
    if g.failure is not None:
        return [f"  {name}: runs in PyTorch, compiling it failed: {g.failure}", f"      fix: {suggestion(Reason.COMPILE_FAILED)}"]
    compute = sum(1 for op, _ in g.ops if is_compute(op))
    on = sum(1 for r in g.regions if r["on_ort"])
    lines = [f"  {name}: {compute} compute ops, {on}/{len(g.regions)} region(s) on ORT; in execution order:"]
    steps = g.steps or g.regions
    n = 0
    for step in steps:
        if "pytorch" in step:
            ops = [(op, r) for op, r in step["pytorch"] if is_compute(op)]
            if not ops:
                continue
            n += 1
            lines.append(f"    {n}. PyTorch  {_ops_summary([op for op, _ in ops])}")
            continue
        n += 1
        region_ops = [op for op in step["ops"] if is_compute(op)]
        extra = ""
        where = "ORT    " if step["on_ort"] else "PyTorch (failed on ORT)"
        if not step["on_ort"] and step.get("error"):
            extra = f"\n         why: {step['error']}"
        tune = step.get("autotune")
        if tune:
            where = "ORT    " if tune["chosen"] == "ort" else "PyTorch (autotune)"
            extra = f"; autotune: ORT {tune['ort_ms']:.3f} ms vs PyTorch {tune['pytorch_ms']:.3f} ms"
        placed = step.get("ep_nodes")
        if placed and (len(placed) > 1 or "CPUExecutionProvider" not in placed):
            total = sum(placed.values())
            extra += "; ONNX nodes on " + ", ".join(
                f"{provider.removesuffix('ExecutionProvider')} {k} ({k / total:.0%})"
                for provider, k in sorted(placed.items(), key=lambda kv: -kv[1])
            )
        lines.append(f"    {n}. {where}  {step['name']}: {len(region_ops)} ops ({_ops_summary(region_ops)}){extra}")
    return lines


def _ops_summary(ops: list[str], limit: int = 4) -> str:
    counts = collections.Counter(ops)
    names = [f"{op} x{c}" if c > 1 else op for op, c in counts.items()]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _break_lines(b: GraphBreak) -> list[str]:
    times = f" (x{b.count})" if b.count > 1 else ""
    if b.split and b.after_graph is None and not b.file:
        lines = [f"  graph break before any graph{times}: {b.summary}"]
    elif b.split:
        lines = [f"  graph break at {b.where}{times}: {b.summary}"]
    else:
        lines = [f"  dynamo left a whole function to Python: {b.summary}"]
    if b.code:
        lines.append(f"      runs in Python: {b.code}")
    return lines

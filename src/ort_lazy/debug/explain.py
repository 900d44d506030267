"""``ort_lazy.explain(model, *example_inputs)``: what runs on ORT, what stays in PyTorch, and why."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import torch

from ..options import Options
from ..partition import GraphRecord, recording
from ..support import Reason

__all__ = ["ExplainReport", "explain", "suggestion"]

_SUGGESTIONS = {
    Reason.NO_MAPPING: "no ONNX translation exists; it stays in PyTorch (a custom ONNX translation would move it)",
    Reason.NO_KERNEL: "ORT has no kernel for this dtype on this provider: cast to float32/float16 around it, "
    "or choose a provider that has one",
    Reason.EXCLUDED: "remove it from torch_executed_ops / ORT_LAZY_TORCH_EXECUTED_OPS to run it on ORT",
    Reason.EXPORT_FAILED: "set ORT_LAZY_DUMP_DIR and ORT_LAZY_RUN_TYPE=debug to inspect the region",
    Reason.ORT_FAILED: "set ORT_LAZY_DUMP_DIR to get the ONNX model and try it in onnxruntime directly",
    Reason.UNSUPPORTED_DTYPE: "ONNX cannot carry this dtype; cast to a supported one",
    Reason.SMALL_REGION: "lower min_block_size / ORT_LAZY_MIN_BLOCK_SIZE",
    Reason.MUTATION: "nothing to do: in-place updates of graph inputs (e.g. BatchNorm running stats) stay in PyTorch",
    Reason.AUTOTUNE: "nothing to do: PyTorch measured faster for this region",
}


def suggestion(reason: str) -> str:
    """A suggested fix for a fallback reason ('' when there is none)."""
    for key, text in _SUGGESTIONS.items():
        if reason.startswith(key):
            return text
    return ""


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
            "graphs": [{"tag": g.tag, "regions": g.regions, "ops": len(g.ops)} for g in self.graphs],
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


def explain(model: Any, *example_inputs: Any, backward: bool = False, **options: Any) -> ExplainReport:
    """Compile ``model`` with the ORT backend on ``example_inputs`` and report every decision.

    With ``backward=True`` (and inputs or parameters that require grad) the backward graph is
    compiled and reported too.
    """
    from ..frontends.dynamo import make_backend

    opts = Options.from_env(**options)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_backend(opts))
    with recording() as records:
        out = compiled(*example_inputs)
        if backward:
            flat = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
            if flat:
                sum(t.float().sum() for t in flat).backward()
    torch._dynamo.reset()
    return ExplainReport(list(records))

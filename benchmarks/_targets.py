"""The project's targets: goals for ratios of the rows, checked after each run and reported.

Each :class:`Target` bounds one ratio of one row (2-core CPU, fp32); :func:`check_targets`
evaluates those whose row was measured. They are reported, never asserted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from _report import ratio
from _rows import PROVIDERS, Row

__all__ = ["TARGETS", "Target", "check_targets", "format_targets"]


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal for one ratio of one row: ``row.<field> <= limit``."""

    label: str
    model: str
    mode: str
    backend: str
    field: str
    limit: float


#: The project's targets (2-core CPU, fp32), checked and reported; never asserted in tests.
TARGETS: tuple[Target, ...] = (
    Target("TransformerEncoderLayer inference vs eager", "transformer", "inference", "ort", "vs_eager", 0.60),
    Target("TransformerEncoderLayer inference vs raw ORT floor", "transformer", "inference", "ort", "vs_floor", 1.02),
    Target("TransformerEncoderLayer inference vs best ORT run", "transformer", "inference", "ort", "vs_best", 1.10),
    Target("MLP inference vs best ORT run", "mlp", "inference", "ort", "vs_best", 1.50),
    # ort-lazy's own per-call cost: against torch.compile with the least backend on ORT
    Target("MLP inference vs the least torch.compile backend on ORT", "mlp", "inference", "ort", "vs_least", 1.10),
    Target("Mixed regime penalty (TransformerEncoderLayer after a torch matmul)", "transformer", "inference", "ort-mixed", "mixed_penalty", 1.15),
    *(Target(f"{m} inference vs best ORT run", m, "inference", "ort", "vs_best", 1.10) for m in ("bert", "gpt2", "resnet", "vit")),
    *(Target(f"Training step ({m}) vs eager", m, "train", "ort", "vs_eager", 1.00) for m in ("bert", "gpt2", "resnet", "vit")),
    *(Target(f"precision int8-dynamic ({m}) vs fp32 ort-lazy", m, "inference", "ort-int8", "vs_ort", 0.50) for m in ("ffn", "bert")),
    Target("MLP inference vs eager", "mlp", "inference", "ort", "vs_eager", 0.60),
    Target("MLP inference vs raw ORT floor", "mlp", "inference", "ort", "vs_floor", 1.30),
    Target("Training step (TransformerEncoderLayer) vs eager", "transformer", "train", "ort", "vs_eager", 0.90),
    Target("Training step (MLP) vs eager", "mlp", "train", "ort", "vs_eager", 1.00),
    *(
        Target(f"Training step ({m}) vs dynamo+AOTAutograd with PyTorch's kernels", m, "train", "ort", "vs_floor", 1.00)
        for m in ("mlp", "transformer", "resnet", "bert", "gpt2", "vit")
    ),
    Target("First call vs Inductor's first call (transformer inference)", "transformer", "inference", "ort", "first_vs_inductor", 0.05),
    Target("First call vs Inductor's first call (mlp inference)", "mlp", "inference", "ort", "first_vs_inductor", 0.05),
    Target("First call vs Inductor's first call (transformer train)", "transformer", "train", "ort", "first_vs_inductor", 0.05),
    Target("First call vs Inductor's first call (mlp train)", "mlp", "train", "ort", "first_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (transformer inference)", "transformer", "inference", "ort", "compile_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (mlp inference)", "mlp", "inference", "ort", "compile_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (transformer train)", "transformer", "train", "ort", "compile_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (mlp train)", "mlp", "train", "ort", "compile_vs_inductor", 0.05),
    Target("Peak memory, TransformerEncoderLayer inference vs eager", "transformer", "inference", "ort", "peak_vs_eager", 1.20),
    # each execution provider with rows of its own: ort-lazy on it against the best direct run on it
    *(
        Target(
            f"ort-lazy on {p.label} within 1.10x of the best direct {p.label}-EP run ({m} inference)",
            m, "inference", f"ort-{p.key}", "vs_best", 1.10,
        )
        for p in PROVIDERS
        for m in ("transformer", "cnn", "bert", "gpt2", "resnet", "vit", "llama")
    ),
)


def check_targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each target whose row was measured, with its value and whether it is met."""
    index = {(r.model, r.mode, r.backend): r for r in rows}
    out = []
    for t in TARGETS:
        row = index.get((t.model, t.mode, t.backend))
        if row is None or row.status != "ok":
            continue
        if t.field == "peak_vs_eager":
            eager = index.get((t.model, t.mode, "eager"))
            value = ratio(row.peak_mib, eager.peak_mib if eager else None)
        elif t.field == "vs_least":
            least = index.get((t.model, t.mode, "dynamo+best-ort"))
            value = ratio(row.median_ms, least.median_ms if least and least.status == "ok" else None)
        else:
            value = getattr(row, t.field)
        if value is None:
            continue
        out.append({"target": t.label, "value": value, "limit": t.limit, "met": value <= t.limit})
    return out


def format_targets(results: Sequence[dict[str, Any]], informational: bool = False) -> str:
    """The target check as text lines; ``informational`` (``--quick``: too few calls to judge
    speed) shows each value against its target without a verdict."""
    if not results:
        return "targets: none measured (needs the mlp/transformer rows with eager, ort, floor, inductor)"
    if informational:
        lines = ["targets (informational only: --quick times too few calls to judge them):"]
    else:
        lines = ["targets:"]
    for t in results:
        mark = "info" if informational else ("met " if t["met"] else "MISS")
        lines.append(f"  [{mark}] {t['target']}: {t['value']:.3f} (target <= {t['limit']:.2f})")
    return "\n".join(lines)

"""``ort_lazy.explain(model, *example_inputs)``: what runs on ORT, what stays in PyTorch, and why."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from .. import _compat
from ..debug.records import ExplainReport, GraphBreak, GraphRecord, recording
from .dynamo import make_backend
from .settings import resolve_options

__all__ = ["explain"]


def explain(model: Any, *example_inputs: Any, backward: bool = False, **options: Any) -> ExplainReport:
    """Compile ``model`` with the ORT backend on ``example_inputs`` and report every decision.

    The report lists each graph dynamo captured with its ORT regions and PyTorch ops in
    execution order, the share of compute ops on ORT, every op left to PyTorch with its reason,
    and dynamo's graph breaks (the code at a break runs in Python, outside every graph).
    ``model`` and ``example_inputs`` are not changed: a copy of each runs. With ``backward=True``
    (and inputs or parameters that require grad) the backward graph is compiled and reported too.
    """
    opts = resolve_options(**options)
    target = _copy_model(model)
    inputs = torch.utils._pytree.tree_map(_copy_tensor, list(example_inputs))
    torch._dynamo.reset()
    before = _compat.graph_break_counts()
    backend = make_backend(opts)
    breaks: list[GraphBreak] = []
    with recording() as records:
        graphs = 0

        def recording_backend(gm: torch.fx.GraphModule, graph_inputs: Sequence[Any], **kwargs: Any) -> Any:
            nonlocal graphs
            graphs += 1
            start = len(records)
            try:
                return backend(gm, graph_inputs, **kwargs)
            finally:
                for record in records[start:]:
                    record.dynamo_graph = graphs
                where = _compat.graph_break_of(gm)
                if where is not None:
                    breaks.append(GraphBreak(where[0], where[1], where[2], after_graph=graphs))

        compiled = torch.compile(target, backend=recording_backend)
        out = compiled(*inputs)
        if backward:
            flat = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
            if flat:
                sum(t.float().sum() for t in flat).backward()
        _tag_backward(records)
    breaks += _unmatched_breaks(before, _compat.graph_break_counts(), breaks)
    torch._dynamo.reset()
    approximate = opts.precision != "fp32" or opts.fast_math
    label = opts.precision + (" with fast_math" if opts.fast_math else "")
    accuracy = _accuracy(model, example_inputs, out, label) if approximate else None
    return ExplainReport(list(records), graph_breaks=breaks, dynamo_graphs=graphs, accuracy=accuracy)


def _accuracy(model: Any, example_inputs: Sequence[Any], out: Any, precision: str) -> dict[str, Any]:
    """How far ``out`` (compiled with a reduced precision or ``fast_math``) is from eager PyTorch's outputs."""
    with torch.no_grad():
        expected = _copy_model(model)(*torch.utils._pytree.tree_map(_copy_tensor, list(example_inputs)))
    pairs = [
        (a.detach().double(), b.detach().double())
        for a, b in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(expected))
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and b.is_floating_point() and b.numel()
    ]
    abs_error = max((float((a - b).abs().max()) for a, b in pairs), default=0.0)
    scale = max((float(b.abs().max()) for _, b in pairs), default=0.0)
    return {"precision": precision, "max_abs_error": abs_error, "max_rel_error": abs_error / scale if scale else 0.0}


def _copy_model(model: Any) -> Any:
    """A copy of ``model`` to run (an nn.Module's buffers and grads stay the user's), or
    ``model`` itself when it cannot be copied (a plain function has no state to protect)."""
    if not isinstance(model, torch.nn.Module):
        return model
    try:
        return copy.deepcopy(model)
    except Exception:  # an uncopyable module: run the user's
        return model


def _copy_tensor(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    copied = value.detach().clone()
    return copied.requires_grad_(value.requires_grad) if copied.is_floating_point() or copied.is_complex() else copied


def _tag_backward(records: list[GraphRecord]) -> None:
    """Backward graphs compile after their forward's dynamo graph: give them its number."""
    last = None
    for record in records:
        if record.dynamo_graph is not None:
            last = record.dynamo_graph
        elif record.tag == "backward":
            record.dynamo_graph = last


def _unmatched_breaks(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], seen: list[GraphBreak]
) -> list[GraphBreak]:
    """Breaks dynamo counted that ended no captured graph: at a frame's first traced line (no
    graph before them), or frames dynamo gave up on altogether (they run in Python)."""
    out: dict[tuple[bool, str], GraphBreak] = {}
    for category, split in (("graph_break", True), ("unimplemented", False)):
        old, new = before.get(category, {}), after.get(category, {})
        for reason, n in new.items():
            extra = n - old.get(reason, 0) - (sum(1 for b in seen if b.reason == reason) if split else 0)
            if extra <= 0:
                continue
            found = GraphBreak(reason, count=extra if split else 1, split=split)
            key = (split, found.summary)  # one entry per reason as shown
            if key in out:
                out[key].count += found.count if split else 0
            else:
                out[key] = found
    return list(out.values())

"""``ort_lazy.explain(model, *example_inputs)``: what runs on ORT, what stays in PyTorch, and why."""

from __future__ import annotations

from typing import Any

import torch

from ..debug.records import ExplainReport, recording
from ..options import Options
from .dynamo import make_backend

__all__ = ["explain"]


def explain(model: Any, *example_inputs: Any, backward: bool = False, **options: Any) -> ExplainReport:
    """Compile ``model`` with the ORT backend on ``example_inputs`` and report every decision.

    With ``backward=True`` (and inputs or parameters that require grad) the backward graph is
    compiled and reported too.
    """
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

"""torch.fx front door: ``ort_lazy.fx.compile(graph_module, example_inputs)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..options import Options
from .dynamo import _compile_dynamo_graph

__all__ = ["compile"]


def compile(gm: torch.fx.GraphModule | torch.nn.Module, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """Compile a torch.fx GraphModule (or any module) so its supported parts run on ORT.

    The graph is lowered to aten ops with AOTAutograd (so training works) and partitioned like
    the dynamo path, specialised to the example inputs' shapes. Returns a callable taking the same positional inputs.
    """
    opts = Options.from_env(**options)
    return _compile_dynamo_graph(gm, list(example_inputs), opts)

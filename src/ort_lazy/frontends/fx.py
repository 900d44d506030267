"""torch.fx front door: ``ort_lazy.fx.compile(graph_module, example_inputs)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..lowering import lower_fast_paths
from ..options import Options
from .dynamo import _compile_dynamo_graph

__all__ = ["compile"]


class _FlatOutputs(torch.nn.Module):
    """Returns the wrapped module's outputs as a flat tuple (what AOTAutograd needs)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.spec: pytree.TreeSpec | None = None

    def forward(self, *args: Any) -> tuple[Any, ...]:
        leaves, self.spec = pytree.tree_flatten(self.inner(*args))
        return tuple(leaves)


def compile(gm: torch.fx.GraphModule | torch.nn.Module, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """Compile a torch.fx GraphModule (or any module) so its supported parts run on ORT.

    The graph is lowered to aten ops with AOTAutograd (so training works) and partitioned like
    the dynamo path, specialised to the example inputs' shapes. Returns a callable taking the
    same positional inputs and returning the same output structure.
    """
    opts = Options.from_env(**options)
    if isinstance(gm, torch.fx.GraphModule):
        lower_fast_paths(gm)
    flat = _FlatOutputs(gm)
    with torch.no_grad():
        flat(*example_inputs)  # records the output structure
    spec = flat.spec
    compiled = _compile_dynamo_graph(flat, list(example_inputs), opts)

    def run(*args: Any) -> Any:
        out = compiled(*args)
        return pytree.tree_unflatten(list(out), spec)

    return run

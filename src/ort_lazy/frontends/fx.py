"""torch.fx front door: ``ort_lazy.fx.compile(graph_module, example_inputs)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..lowering.aten import compile_captured
from ..options import Options

__all__ = ["compile"]


class _FlatOutputs(torch.nn.Module):
    """Returns the wrapped module's outputs as a flat tuple (what AOTAutograd needs) and
    records their structure when traced."""

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
    the dynamo path, specialised to the example inputs' shapes. Compiling traces on fake
    tensors: neither the module (buffers such as BatchNorm's running statistics) nor the
    example inputs change. Returns a callable taking the same positional inputs and returning
    the same output structure.
    """
    opts = Options.from_env(**options)
    flat = _FlatOutputs(gm)
    compiled = compile_captured(flat, list(example_inputs), opts)

    def run(*args: Any) -> Any:
        out = compiled(*args)  # tracing (or a fallback run of the module) has set flat.spec
        assert flat.spec is not None
        return pytree.tree_unflatten(list(out), flat.spec)

    return run

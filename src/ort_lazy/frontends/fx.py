"""torch.fx front door: ``ort_lazy.fx.compile(graph_module, example_inputs)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from .. import metrics
from ..lowering.aten import compile_captured
from .settings import resolve_options

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
    the dynamo path, specialised to the example inputs' shapes, dtypes and devices (a call
    with other inputs runs the module itself in PyTorch, warned about once). Compiling traces
    on fake tensors: neither the module (buffers such as BatchNorm's running statistics) nor
    the example inputs change. Returns a callable taking the same positional inputs and
    returning the same output structure.
    """
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, Sequence):
        raise TypeError(
            f"ort_lazy.fx.compile: example_inputs must be a list or tuple of the inputs, got "
            f"{type(example_inputs).__name__}; e.g. ort_lazy.fx.compile(module, [x])"
        )
    opts = resolve_options(**options)
    flat = _FlatOutputs(gm)
    compiled = compile_captured(flat, list(example_inputs), opts)
    expected = [_signature(a) for a in example_inputs]
    name = type(gm).__name__

    def run(*args: Any) -> Any:
        difference = _difference(expected, args)
        if difference is not None:
            # the compiled graph is specialised to the example inputs: others run the module
            # itself, as eager PyTorch would
            metrics.increment("torch_runs")
            metrics.warn_once(
                f"fx-inputs:{id(flat)}:{difference}",
                "ort-lazy: %s was compiled by ort_lazy.fx.compile for other inputs (%s); such calls run in "
                "PyTorch: compile again with these as example inputs",
                name,
                difference,
            )
            return gm(*args)
        out = compiled(*args)  # tracing (or a fallback run of the module) has set flat.spec
        assert flat.spec is not None
        return pytree.tree_unflatten(list(out), flat.spec)

    return run


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device)
    return None  # numbers and other values are not guarded


def _difference(expected: list[Any], args: Sequence[Any]) -> str | None:
    """How ``args`` differ from what the graph was compiled for, None when they do not."""
    if len(args) != len(expected):
        return f"{len(args)} inputs, compiled for {len(expected)}"
    for i, (want, value) in enumerate(zip(expected, args)):
        if want is None:
            continue
        got = _signature(value)
        if got != want:
            if got is None:
                return f"input {i} is a {type(value).__name__}, compiled for a tensor"
            what = ("shape", "dtype", "device")
            k = next(k for k in range(3) if got[k] != want[k])
            return f"input {i} has {what[k]} {got[k]}, compiled for {want[k]}"
    return None

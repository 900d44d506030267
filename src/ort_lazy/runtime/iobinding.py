"""What binding torch tensors to an ORT session takes: the devices ORT reads, each dtype's element
type, each output's shape as a function of the inputs' sizes (planned once per model: torch
allocates the outputs whose dims the inputs give, ORT the others), data pointers for empty
tensors, and ORT-allocated outputs taken into torch through DLPack, checked against the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..specs import OrtModel, TensorSpec, dim_symbols, parse_dim
from .session_create import OrtRunError

__all__ = ["ORT_DEVICES", "NUMPY_TYPES"]


#: Device types ORT execution providers read tensors from; tensors anywhere else (meta, mps,
#: xpu, privateuse ...) are never bound.
ORT_DEVICES = ("cpu", "cuda")

# numpy element types for IOBinding; bfloat16 has none and is passed as its ONNX enum.
NUMPY_TYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
    torch.bfloat16: 16,
}


def _output_shapes(
    model: OrtModel,
) -> tuple[dict[str, tuple[int, int]], list[Callable[[dict[str, int]], list[int]] | None]]:
    """Where each symbol of ``model``'s input specs is first read (input, dim: a tensor dim
    that is the symbol itself), and per output a function of those symbols' values giving its
    shape: None for a static output, and for one a dim of which no input's size gives (ORT
    allocates that one: only it knows the size)."""
    symbol_at: dict[str, tuple[int, int]] = {}
    for i, spec in enumerate(model.input_specs):
        if spec.scalar:
            continue
        for d, dim in enumerate(spec.shape):
            if isinstance(dim, str) and dim.isidentifier() and dim not in symbol_at:
                symbol_at[dim] = (i, d)
    shapes: list[Callable[[dict[str, int]], list[int]] | None] = []
    for spec in model.output_specs:
        if spec.static or NUMPY_TYPES.get(spec.dtype) is None:
            shapes.append(None)
            continue
        try:
            needed = set().union(*(dim_symbols(d) for d in spec.shape if isinstance(d, str)))
            dims = [parse_dim(d) if isinstance(d, str) else d for d in spec.shape]
        except ValueError:
            shapes.append(None)
            continue
        if not needed <= set(symbol_at):
            shapes.append(None)
            continue
        shapes.append(lambda symbols, dims=dims: [d(symbols) if callable(d) else d for d in dims])
    used = set().union(*(dim_symbols(d) for s, f in zip(model.output_specs, shapes) if f is not None for d in s.shape if isinstance(d, str)))
    return {s: at for s, at in symbol_at.items() if s in used}, shapes


_PLACEHOLDERS: dict[torch.device, torch.Tensor] = {}


def _data_ptr(t: torch.Tensor) -> int:
    """The tensor's data pointer; a valid dummy one for empty tensors (ORT rejects null)."""
    if t.numel():
        return t.data_ptr()
    dummy = _PLACEHOLDERS.get(t.device)
    if dummy is None:
        dummy = _PLACEHOLDERS.setdefault(t.device, torch.empty(16, dtype=torch.uint8, device=t.device))
    return dummy.data_ptr()


def _symbol_values(specs: Sequence[TensorSpec], inputs: Sequence[torch.Tensor]) -> dict[int | str, int]:
    """Values of the symbolic dims (``s0`` ...) as bound by this call's inputs."""
    values: dict[int | str, int] = {}
    for spec, value in zip(specs, inputs):
        for d, n in zip(spec.shape, getattr(value, "shape", ())):
            if isinstance(d, str):
                values[d] = n
    return values


def _checked(out: torch.Tensor, spec: TensorSpec, dims: dict[int | str, int]) -> torch.Tensor:
    """Reject an ORT output whose rank or known dims differ from the graph's (never return it)."""
    if out.dim() != len(spec.shape) or any(
        (d if isinstance(d, int) else dims.get(d, n)) != n for d, n in zip(spec.shape, out.shape)
    ):
        raise OrtRunError(f"ORT returned shape {tuple(out.shape)}, the graph expects {spec.shape}")
    return out


def _from_ortvalue(value: Any, dtype: torch.dtype) -> torch.Tensor:
    """An ORT-allocated output as a torch tensor sharing its memory (DLPack)."""
    out = torch.from_dlpack(value.to_dlpack())
    if out.dtype != dtype:  # defensive: never hand back a silently different dtype
        raise OrtRunError(f"ORT returned {out.dtype}, the graph expects {dtype}")
    return out

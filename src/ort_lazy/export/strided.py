"""``as_strided`` and its scatter: the ops that address a tensor's memory, not its values.

``x.as_strided(size, stride, offset)`` reads element ``offset + sum(i_k * stride_k)`` of
``x``'s storage; ``as_strided_scatter`` writes ``src`` there in a copy of ``x``. An ONNX value
has no storage, only its elements in row-major order, so both translate right only where
row-major order *is* the storage order: ``x`` contiguous, starting at its storage's first
element, and every addressed element one of ``x``'s own. The exporter's ``as_strided`` assumes
that without checking (a transposed input read the wrong elements, silently);
:func:`layout_problem` is the check ort-lazy applies (:data:`ort_lazy.support.DISTRUSTED_WHEN`),
from the strides the graph's fake tensors carry, which are eager's; anything else stays in
PyTorch. :mod:`ort_lazy.lowering.layouts` rewrites the calls of a graph so they address
row-major tensors before it is partitioned.

The exporter has no ``as_strided_scatter`` translation; AOTAutograd writes one into the
backward of every ``as_strided`` (timm's adaptive pooling restrides its mean, so ConvNeXt,
PoolFormer and MaxViT training steps had a PyTorch op in their backward).
:func:`as_strided_scatter` is a ``ScatterND`` on the flattened input at the addressed
positions, which are computed when the graph is translated (static sizes only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .emitter import translation_emitter

__all__ = ["TRANSLATIONS", "layout_problem", "storage_order", "last_position", "flat_positions", "MAX_SCATTER_POSITIONS"]

#: addressed elements above which ``as_strided_scatter`` is not translated (its positions are a
#: constant of 8 bytes each in the model)
MAX_SCATTER_POSITIONS = 1 << 22


def storage_order(t: torch.Tensor) -> list[int] | None:
    """The permutation of ``t``'s dims into the order its elements lie in memory, when they
    are dense and do not overlap (the identity for a contiguous tensor); None otherwise."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    return order if t.permute(order).is_contiguous() else None


def last_position(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    """The storage position of the last element of ``as_strided(size, stride, offset)`` (non-negative
    strides, no empty dim)."""
    return offset + sum((n - 1) * s for n, s in zip(size, stride))


def flat_positions(size: Sequence[int], stride: Sequence[int], offset: int) -> np.ndarray:
    """The storage position of every element of ``as_strided(size, stride, offset)``, shaped ``size``."""
    positions = np.array(offset, dtype=np.int64)
    for dim, (n, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = n
        positions = positions + (np.arange(n, dtype=np.int64) * step).reshape(shape)
    return np.broadcast_to(positions, tuple(size))


def layout_problem(arguments: dict[str, Any], scatter: bool = False) -> str | None:
    """Why the translation of an ``as_strided`` (``scatter``: ``as_strided_scatter``) call with
    these bound arguments (tensors as fake tensors) would not compute eager's result; None
    when it would."""
    x = arguments.get("self", arguments.get("input"))
    size, stride = arguments.get("size"), arguments.get("stride")
    offset = arguments.get("storage_offset")
    if not isinstance(x, torch.Tensor) or size is None or stride is None:
        return "arguments it cannot read"
    numbers = [*size, *stride, 0 if offset is None else offset, *x.shape, x.storage_offset()]
    if not all(type(v) is int for v in numbers):
        return "symbolic sizes or strides"
    if x.storage_offset() != 0 or not x.is_contiguous():
        return (
            f"its input's memory layout (strides {tuple(x.stride())}, offset {x.storage_offset()}) "
            "is not its row-major order, which is all ORT sees"
        )
    offset = offset or 0
    count = math.prod(size)
    if count == 0:
        return None
    if any(s < 0 for s in stride) or offset < 0:
        return "negative strides or offset"
    if last_position(size, stride, offset) >= x.numel():
        return "it addresses memory beyond its input's elements"
    if scatter:
        if count > MAX_SCATTER_POSITIONS:
            return f"it writes more than {MAX_SCATTER_POSITIONS} elements"
        if np.unique(flat_positions(size, stride, offset)).size != count:
            return "it writes some elements more than once (overlapping strides)"
    return None


def as_strided_scatter(self: Any, src: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    """``as_strided_scatter``: ``self`` with ``src`` written at the addressed positions (static
    sizes; :func:`layout_problem` has checked the call)."""
    import onnx_ir as ir

    e = translation_emitter("as_strided_scatter")
    positions = flat_positions([int(n) for n in size], [int(s) for s in stride], int(storage_offset or 0))
    flat_shape = e.op("Constant", value=ir.tensor(np.array([-1], dtype=np.int64)))
    flat = e.op("Reshape", self, flat_shape)
    indices = e.op("Constant", value=ir.tensor(np.ascontiguousarray(positions.reshape(-1, 1))))
    updates = e.op("Reshape", e.cast(src, self.dtype), flat_shape)
    written = e.op("ScatterND", flat, indices, updates)
    return e.op("Reshape", written, e.op("Shape", self))


TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    torch.ops.aten.as_strided_scatter.default: as_strided_scatter,
    torch.ops.prims.as_strided_scatter.default: as_strided_scatter,
}

"""Ops that make a whole tensor: ``arange``, random draws in half types, ``copy``.

Floating ``arange`` as ``start + i * step`` (ORT's Range accumulates: nearly a whole step off
after 10000 steps), ``rand``/``randn`` in float16 / bfloat16 drawn in float32 and rounded (the
exporter's forms are ill-typed or missing there), and ``aten.copy`` (a functionalized
``copy_``) with its source broadcast to the destination (the exporter casts the source alone).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import _aten

__all__ = ["FACTORY_DECOMPOSITIONS"]


def float_arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> Any:
    """Floating ``arange`` as ``start + i * step`` over integer ``i``, in float64, rounded once
    (eager's CPU kernel). ORT's Range accumulates in the output type: ``arange(0, 1000, 0.1)``
    drifted by 0.097, nearly a whole step, in float32 and float64 alike."""
    if end is None:
        start, end = 0, start
    numbers = (start, end, step)
    if not all(type(v) in (int, float) for v in numbers):
        return NotImplemented  # symbolic bounds: the translation's Range
    if dtype is None:
        dtype = torch.get_default_dtype() if any(type(v) is float for v in numbers) else torch.int64
    if not dtype.is_floating_point or step == 0:
        return NotImplemented
    count = max(0, math.ceil((end - start) / step))
    index = torch.arange(count, dtype=torch.int64, device=device).to(torch.float64)
    return (index * float(step) + float(start)).to(dtype)


def low_precision_random(op: Any) -> Any:
    """``rand`` / ``randn`` made in float16 or bfloat16: drawn in float32 and rounded, as ORT
    draws. The exporter's ``RandomUniformLike`` / ``RandomNormalLike`` are typed float32 for
    float16 (ORT refused the whole region's session) and have no bfloat16 form (left to
    PyTorch)."""

    def draw(size: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
        dtype = dtype or torch.get_default_dtype()
        if dtype not in (torch.float16, torch.bfloat16):
            return NotImplemented
        return op(size, dtype=torch.float32, **kwargs).to(dtype)

    return draw


def broadcast_copy(self: torch.Tensor, src: Any, non_blocking: bool = False) -> Any:
    """``aten.copy`` (what a functionalized ``copy_`` becomes): the source cast, expanded to
    ``self``'s shape and on its device. The exporter translates ``copy`` as a cast of the source
    alone, so ``y.copy_(row)`` then ``y.sum()`` summed one row."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if (
        isinstance(src, torch.Tensor)
        and src.device == self.device
        and src.dim() == self.dim()
        and all(statically_known_true(a == b) for a, b in zip(src.shape, self.shape))
    ):
        # same shape: a cast, or a copy ORT drops (its Cast to the same type copies)
        return src.clone() if src.dtype == self.dtype else NotImplemented
    if not isinstance(src, torch.Tensor):  # ``y.copy_(2.5)`` reaches here with the number
        return torch.full_like(self, src)
    return src.to(device=self.device, dtype=self.dtype).expand(self.shape).clone()


#: tensor factories and copies (op -> decomposition)
FACTORY_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.arange.default: float_arange,
    _aten.arange.start: float_arange,
    _aten.arange.start_step: float_arange,
    _aten.rand.default: low_precision_random(_aten.rand.default),
    _aten.randn.default: low_precision_random(_aten.randn.default),
    _aten.copy.default: broadcast_copy,
}

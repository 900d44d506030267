"""ONNX translations that select without ORT's ``Where`` on large tensors.

ORT's CPU ``Where`` runs one element at a time on one thread: 10.7 ms for 2M float32 elements
on 2 cores, against 0.3 ms for an ``Add`` of the same size. The ReLU gradient
(``aten.threshold_backward``: ``where(self <= threshold, 0, grad)``) is that op in every ReLU
network's training step (19% of a TransformerEncoderLayer's backward region).

For float32/float64 gradients, the translation computes it by arithmetic when every gradient
element is finite (``grad * m + (m - 1) * -0.0``, ``m`` = 1 where the element passes: exactly
``grad`` there and ``+0.0`` elsewhere, signed zeros included), and by ``Where`` otherwise
(``inf * 0`` would be NaN where eager gives 0); an ONNX ``If`` on one sum of the gradient picks
the branch per call. Other dtypes keep ``Where``, and so do tensors of at most :data:`SMALL_SELECT`
elements, where the check and the ``If`` cost more than ``Where`` itself (a [32, 256]
gradient: 34 us by ``Where``, about 85 us by the checked arithmetic).

Softmax that keeps rows of only ``-inf`` at 0 (``aten._safe_softmax``, every attention of
``scaled_dot_product_attention``'s decomposition) needs a per-row guard: a floor raising such
rows before the softmax (a full-size ``Max``) and a mask after it (a full-size ``Mul``), plus
several small per-row kernels. The translation computes the row maxima, and only when one of
them is ``-inf`` runs the guarded form (an ``If``); otherwise one ``Softmax``, which is what the
guarded form computes when no row is masked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .emitter import Emitter, translation_emitter

__all__ = ["TRANSLATIONS", "SMALL_SELECT", "LARGE_SELECT"]

#: elements up to which a ReLU gradient is selected by ``Where`` (ORT's CPU ``Where``: about
#: 4.4 ns per element on one thread; the finite check, ``If`` and arithmetic: about 50 us plus
#: 1 ns per element on 2 cores)
SMALL_SELECT = 16384

#: elements above which a ReLU gradient runs in PyTorch by default (``aten.threshold_backward``
#: in ``torch_preferred_ops``, :data:`ort_lazy.support.PREFERRED_WHEN`): the checked arithmetic
#: writes five full-size tensors where PyTorch's kernel writes one (2M elements: 3.1 ms in a
#: TransformerEncoderLayer's backward region against 0.33 ms), so above this size PyTorch's
#: kernel pays for the region boundary it may add
LARGE_SELECT = 65536


def threshold_backward(grad: Any, self: Any, threshold: Any) -> Any:
    """``aten.threshold_backward``: ``grad`` where ``self > threshold`` (or NaN), else 0."""
    import onnx_ir as ir

    e = translation_emitter("threshold_backward")
    t = grad.dtype
    bound = threshold if isinstance(threshold, ir.Value) else e.const(float(threshold), self.dtype)
    clamped = e.op("LessOrEqual", self, e.cast(bound, self.dtype))
    zero = e.const(0.0, t)
    if t not in (ir.DataType.FLOAT, ir.DataType.DOUBLE) or _static_numel(grad) <= SMALL_SELECT:
        return e.op("Where", clamped, zero, grad)
    # an infinite or NaN element makes the sum infinite or NaN, so s - s is NaN; finite values
    # whose sum overflows only send this call to the Where branch (exact either way). One pass
    # over the gradient, where the sum of grad * 0 took two.
    total = e.op("ReduceSum", grad, keepdims=0)
    finite = e.op("Not", e.op("IsNaN", e.op("Sub", total, total)))

    def fast(f: Emitter) -> list[Any]:
        passes = f.op("Cast", f.op("Not", clamped), to=t)
        # (m - 1) * -0.0: +0.0 where clamped, -0.0 where not; adding it keeps grad (and its -0.0)
        signed_zero = f.op("Mul", f.op("Sub", passes, f.const(1.0, t)), f.const(-0.0, t))
        return [f.op("Add", f.op("Mul", grad, passes), signed_zero)]

    [out] = e.branch(finite, fast, lambda x: [x.op("Where", clamped, zero, grad)])
    out.dtype, out.shape = grad.dtype, grad.shape  # a type of its own, not grad's object
    return out


def _static_numel(value: Any) -> float:
    """Elements of ``value`` when its shape is static, else infinity."""
    shape = value.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return math.inf
    return math.prod(shape)


def safe_softmax(self: Any, dim: int, dtype: Any = None) -> Any:
    """``aten._safe_softmax``: softmax along ``dim``, 0 on rows whose elements are all ``-inf``.

    ``dtype`` (an ONNX type here) converts the input first, as PyTorch does.
    """
    import onnx_ir as ir

    e = translation_emitter("safe_softmax")
    if self.shape is None:
        raise ValueError("safe softmax needs the input's rank")
    result_type = ir.DataType(dtype) if dtype is not None else self.dtype
    # ORT has no bfloat16 kernels for these (and widening does not reach into an If's
    # branches): computed in float32 and rounded once, as eager's bfloat16 softmax does
    t = ir.DataType.FLOAT if result_type == ir.DataType.BFLOAT16 else result_type
    x = e.cast(self, t)
    x.dtype, x.shape = t, self.shape
    rank = len(self.shape)
    if rank == 0:
        x = e.op("Unsqueeze", x, e.op("Constant", value_ints=[0]))
    axis = dim % rank if rank else 0
    row_max = e.op("ReduceMax", x, e.op("Constant", value_ints=[axis]), keepdims=1)
    # rows of only -inf (ORT's ReduceMax skips NaN, as the guarded form below relies on)
    masked = e.op("Equal", row_max, e.const(-math.inf, t))
    any_masked = e.op("Cast", e.op("ReduceMax", e.op("Cast", masked, to=ir.DataType.FLOAT), keepdims=0), to=ir.DataType.BOOL)

    def guarded(g: Emitter) -> list[Any]:
        floor = g.op("Where", masked, g.const(0.0, t), g.const(-math.inf, t))
        probabilities = g.op("Softmax", g.op("Max", x, floor), axis=axis)
        return [g.op("Mul", probabilities, g.op("Cast", g.op("Not", masked), to=t))]

    [out] = e.branch(any_masked, guarded, lambda p: [p.op("Softmax", x, axis=axis)])
    out.dtype, out.shape = t, x.shape
    if rank == 0:
        out = e.op("Squeeze", out, e.op("Constant", value_ints=[0]))
        out.dtype, out.shape = t, self.shape
    if result_type != t:
        out = e.op("Cast", out, to=result_type)
        out.dtype, out.shape = result_type, self.shape
    return out


#: the translations, by aten overload
TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    torch.ops.aten.threshold_backward.default: threshold_backward,
    torch.ops.aten._safe_softmax.default: safe_softmax,
}

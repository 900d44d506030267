"""Loss functions and their gradients with eager's rounding and NaN rule.

``smooth_l1_loss_backward`` as eager's kernel computes it (a NaN difference gives a NaN
gradient, where torch's decomposition gives 0); ``soft_margin_loss`` and its gradient take
torch's decomposition for float32 / float64 only (in float16 / bfloat16 eager's kernel rounds
after each step: the op stays whole there).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import _HALF, _aten

__all__ = ["LOSS_DECOMPOSITIONS"]


def _full_precision_only(op: Any) -> Any:
    """torch's decomposition of ``op`` for float32 / float64 only. For float16 / bfloat16 it
    computes the whole op in float32 and rounds once, where eager's CPU kernel rounds after each
    of its steps (``soft_margin_loss``: eager's ``exp(-y * x)`` is inf in float16 from
    ``y * x < -11``, the decomposition's stays finite): the op stays whole there."""

    def decompose(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args):
            return NotImplemented
        return torch._decomp.decomposition_table[op](*args, **kwargs)

    return decompose


def smooth_l1_loss_backward(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, reduction: int, beta: float) -> Any:
    """``smooth_l1_loss_backward`` as eager's kernel computes it: ``+-1`` where ``|d| >= beta``
    (``d = x - target``; its sign by ``d > 0``), ``d / beta`` elsewhere, times the norm and the
    gradient. torch's decomposition takes ``sign(d)`` where ``|d| < beta`` fails, so a NaN
    difference got ``sign(NaN) = 0``: a 0 gradient where eager's is NaN (a NaN prediction
    trained on silently instead of surfacing). float16 / bfloat16 in float32, rounded once, as
    eager computes them."""
    if x.dtype in _HALF:
        wide = smooth_l1_loss_backward(grad.float(), x.float(), target.float(), reduction, beta)
        return wide.to(x.dtype)
    d = x - target
    norm = 1.0 / x.numel() if reduction == 1 else 1.0  # Reduction.MEAN
    one = d.new_ones(())
    unit = torch.where(d > 0, one, -one)
    return norm * torch.where(d.abs() >= beta, unit, d / beta) * grad


#: losses and their gradients (op -> decomposition)
LOSS_DECOMPOSITIONS: dict[Any, Any] = {
    **{op: _full_precision_only(op) for op in (_aten.soft_margin_loss.default, _aten.soft_margin_loss_backward.default)},
    _aten.smooth_l1_loss_backward.default: smooth_l1_loss_backward,
}

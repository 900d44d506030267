"""Activation functions, their gradients and softmax as eager computes them.

* ``gelu`` (erf form) in the pattern ORT's optimizer fuses into its single-pass Gelu kernel;
  float16 / bfloat16 ``gelu``, ``mish`` and ``softplus`` in float32, rounded once;
* float64 ``hardtanh``, ``hardswish``, ``celu`` and the tanh form of ``gelu`` with float64
  constants (the translation's are float32), float64 ``mish`` and ``softplus`` as eager's
  kernels compute them;
* ``relu`` of integers as a clamp; the gradients of ``hardtanh`` and ``hardsigmoid`` as eager's
  kernels compute them;
* float64 ``_log_softmax`` with eager's NaN rule, ``_safe_softmax`` with a ``dtype``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import _HALF, _aten, _float64_only, _torch_decomposition
from .exponentials import expm1

__all__ = ["ACTIVATION_DECOMPOSITIONS", "gelu"]


def integer_relu(x: torch.Tensor) -> Any:
    """``relu`` of integers as a clamp (ORT's Relu has no int64 kernel)."""
    if x.is_floating_point() or x.dtype == torch.bool:
        return NotImplemented
    return torch.clamp_min(x, 0)


@_float64_only
def hardtanh(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Any:
    """``clamp`` with float64 bounds."""
    return torch.clamp(x, min_val, max_val)


@_float64_only
def hardswish(x: torch.Tensor) -> Any:
    """``x * clamp(x + 3, 0, 6) / 6`` in float64."""
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


@_float64_only
def celu(x: torch.Tensor, alpha: float = 1.0) -> Any:
    """``alpha * expm1(x / alpha)`` below 0 (accurate expm1), ``x`` above."""
    return torch.where(x > 0, x, expm1(x * (1.0 / float(alpha))) * float(alpha))


def mish(x: torch.Tensor) -> Any:
    """float64 ``mish`` as eager computes it, ``x * tanh(log1p(exp(x)))`` (ORT's double Mish
    loses its tail: 1e-3 off at -30, 0 below -38 where eager gives 1e-15); float16 / bfloat16 in
    float32, rounded once, as eager (ORT's Mish has no kernel for them)."""
    if x.dtype in _HALF:
        return torch.nn.functional.mish(x.float()).to(x.dtype)
    if x.dtype != torch.float64:
        return NotImplemented
    return x * torch.tanh(torch.log1p(torch.exp(x)))


def softplus(x: torch.Tensor, beta: Any = 1, threshold: Any = 20) -> Any:
    """float64 ``softplus`` as eager computes it, ``x`` where ``beta * x > threshold``, else
    ``log1p(exp(beta * x)) / beta`` (ORT has no double Softplus kernel); float16 / bfloat16 in
    float32, rounded once, as eager."""
    if x.dtype in _HALF:
        return torch.nn.functional.softplus(x.float(), beta, threshold).to(x.dtype)
    if x.dtype != torch.float64:
        return NotImplemented
    scaled = x * beta
    return torch.where(scaled > threshold, x, torch.log1p(torch.exp(scaled)) / beta)


@_float64_only
def gelu_tanh(x: torch.Tensor, approximate: str = "none") -> Any:
    """The tanh form of ``gelu`` with float64 constants (the erf form is :func:`gelu`)."""
    if approximate != "tanh":
        return NotImplemented
    inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * 0.5 * (torch.tanh(inner) + 1.0)


def gelu(x: torch.Tensor, approximate: str = "none") -> Any:
    """``aten.gelu`` (erf form, float32/64) as ``x * (1 + erf(x / sqrt(2))) * 0.5``: the pattern
    ORT's optimizer fuses into its single-pass Gelu kernel (the exporter's whole-op translation
    multiplies in an order ORT does not recognise: five elementwise passes). float16 / bfloat16,
    both forms, in float32 rounded once."""
    if x.dtype in _HALF and approximate in ("none", "tanh"):
        # eager computes in float32 and rounds once; step by step in float16 / bfloat16, 1 + erf
        # cancels for negative x (gelu(-2.5) 2% off in float16, 6% in bfloat16)
        xf = x.float()
        if approximate == "tanh":
            # 0.5 * (1 + tanh(u)) as 1 / (1 + exp(-2u)): no cancellation where tanh(u) rounds
            # to -1 (nor ORT's Sigmoid, 3x off that far out)
            two_u = (xf + xf * xf * xf * 0.044715) * (2.0 * math.sqrt(2.0 / math.pi))
            return (xf / (torch.exp(-two_u) + 1.0)).to(x.dtype)
        return ((xf * (torch.erf(xf / math.sqrt(2.0)) + 1.0)) * 0.5).to(x.dtype)
    if approximate == "tanh":
        return gelu_tanh(x, approximate)
    if approximate != "none" or x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return (x * (torch.erf(x / math.sqrt(2.0)) + 1.0)) * 0.5


def hardtanh_backward(grad: torch.Tensor, x: torch.Tensor, min_val: float, max_val: float) -> Any:
    """``hardtanh_backward`` as one select: the exporter's translation compares strictly, so it
    passed the gradient at ``min_val`` and ``max_val`` (``relu6`` at 0 and 6) where eager's is 0,
    and is ill-typed outside float32. NaN inputs follow eager's vectorized CPU kernels (its
    scalar tail keeps the gradient of a NaN either way): float16 and bfloat16 zero the gradient
    where ``x <= min or x >= max`` (a NaN keeps it), others keep it where ``min < x < max`` (a
    NaN loses it)."""
    zero = grad.new_zeros(())
    if grad.dtype in (torch.float16, torch.bfloat16):
        return torch.where((x <= min_val) | (x >= max_val), zero, grad)
    return torch.where((x > min_val) & (x < max_val), grad, zero)


#: eager's ``hardsigmoid_backward`` scales by ``1.0f / 6.0f``, a float32 sixth, in float64 too
_FLOAT32_SIXTH = 0.1666666716337204


def hardsigmoid_backward(grad_output: torch.Tensor, self: torch.Tensor) -> Any:
    """float64 ``hardsigmoid`` gradients scaled by eager's float32 sixth (torch's reference
    decomposition, used for the other dtypes, scales by a float64 sixth: 7e-9 off eager's)."""
    if not isinstance(grad_output, torch.Tensor) or grad_output.dtype != torch.float64:
        return _torch_decomposition(_aten.hardsigmoid_backward.default, grad_output, self)
    inside = (self > -3.0) & (self < 3.0)
    return torch.where(inside, grad_output * _FLOAT32_SIXTH, torch.zeros_like(grad_output))


def log_softmax_float64(x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
    """float64 ``_log_softmax`` as eager computes it, ``x - max - log(sum(exp(x - max)))``:
    ORT's double LogSoftmax kernel gives finite numbers on a row holding NaN (45.05 for 1) and
    ``-inf`` beside ``+inf``, where eager's whole row is NaN (its float kernel agrees with
    eager)."""
    if x.dtype != torch.float64 or half_to_float:
        return NotImplemented
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - torch.log(torch.exp(shifted).sum(dim, keepdim=True))


def safe_softmax_dtype(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> Any:
    """``aten._safe_softmax`` with a ``dtype``: the conversion, then the op itself, which ORT runs
    by ort-lazy's own translation (``export.selects.safe_softmax``: softmax with its guard for
    rows of only ``-inf`` run when such a row is there)."""
    if dtype is None or dtype == x.dtype:
        return NotImplemented
    return _aten._safe_softmax.default(x.to(dtype), dim)


#: activations, their gradients and softmax (op -> decomposition)
ACTIVATION_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.relu.default: integer_relu,
    _aten.hardtanh.default: hardtanh,
    _aten.hardswish.default: hardswish,
    _aten.celu.default: celu,
    _aten.mish.default: mish,
    _aten.softplus.default: softplus,
    _aten.gelu.default: gelu,
    _aten.hardtanh_backward.default: hardtanh_backward,
    _aten.hardsigmoid_backward.default: hardsigmoid_backward,
    _aten._log_softmax.default: log_softmax_float64,
    _aten._safe_softmax.default: safe_softmax_dtype,
}

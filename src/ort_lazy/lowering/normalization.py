"""Batch, layer and weight normalization in forms ORT runs fast and types correctly.

* batch norm: in eval, one BatchNormalization (float32) or torch's elementwise decomposition
  (other dtypes, where the translation is ill-typed); in training, the batch statistics in
  fewer passes over the input than torch's decomposition takes (:func:`batch_norm_training`);
* layer norm: float16 / bfloat16 in float32, as eager's CPU kernel computes it; its gradient
  with the row sums that carry the weight as matrix-vector products (:func:`layer_norm_backward`);
* the gradient of ``weight_norm``, and ``embedding_renorm`` of float64 with float64 constants.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _compat
from .common import _aten, _concrete, _float64_only, _torch_decomposition

__all__ = ["NORMALIZATION_DECOMPOSITIONS"]


def batch_norm_no_training(x: torch.Tensor, *args: Any) -> Any:
    """Eval batch norm in float64 / float16 / bfloat16 as torch decomposes it (elementwise ops):
    the exporter's translation is ill-typed there; float32 keeps the single BatchNormalization."""
    if x.dtype == torch.float32:
        return NotImplemented
    return _torch_decomposition(_aten._native_batch_norm_legit_no_training.default, x, *args)


def native_batch_norm(
    x: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool, momentum: float, eps: float
) -> Any:
    """``aten.native_batch_norm``: in eval, the no-training op (one BatchNormalization in ORT);
    in training, torch's decomposition (the training translation is distrusted)."""
    if not training and running_mean is not None and running_var is not None:
        return torch.ops.aten._native_batch_norm_legit_no_training.default(
            x, weight, bias, running_mean, running_var, momentum, eps
        )
    out, *stats = _torch_decomposition(
        torch.ops.aten.native_batch_norm.default, x, weight, bias, running_mean, running_var, training, momentum, eps
    )
    # eager's kernel writes its output contiguous (channels-last for a channels-last input), the
    # decomposition in the input's layout: a permuted input gave the traced graph other strides
    return (out.contiguous(memory_format=_compat.memory_format_of(x)), *stats)


def batch_norm_no_stats(x: torch.Tensor, *args: Any) -> Any:
    """``aten._native_batch_norm_legit.no_stats`` (batch norm without running statistics) in
    other dtypes than float32: torch's decomposition (in float32 for float16/bfloat16, as eager
    computes). The exporter's translation mixes float32 constants with the input's type there
    (ill-typed: the op stayed in PyTorch)."""
    if x.dtype == torch.float32:
        return NotImplemented
    return _torch_decomposition(_aten._native_batch_norm_legit.no_stats, x, *args)


def batch_norm_training(
    x: torch.Tensor,
    weight: Any,
    bias: Any,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    """``aten._native_batch_norm_legit_functional`` in training, float32, in 6 passes over the
    input where torch's decomposition takes 9: the batch statistics in two passes each (mean;
    mean of squared deviations, as torch's decomposition computes them), then ``deviation *
    scale + bias`` with the per-channel ``scale = weight * rstd`` (the deviation is the one the
    variance read; ``x * scale + (bias - mean * scale)`` would cost the same passes but cancel
    where the mean is large against the spread). ORT's own ``BatchNormalization`` with these
    statistics as inputs would be one pass, but its CPU kernel runs on one thread: slower than
    the two (ResNet-18's stem, 6.4M elements: 1.8 ms). Other dtypes and eval: torch's
    decomposition."""
    op = torch.ops.aten._native_batch_norm_legit_functional.default
    args = (x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training or x.dtype != torch.float32 or x.dim() < 2:
        return _torch_decomposition(op, *args)
    dims = [0, *range(2, x.dim())]
    mean = x.mean(dims, keepdim=True)
    deviation = x - mean
    var = (deviation * deviation).mean(dims, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    scale = rstd if weight is None else rstd * weight.reshape(mean.shape)
    output = deviation * scale
    if bias is not None:
        output = output + bias.reshape(mean.shape)
    save_mean, save_rstd, biased_var = mean.flatten(), rstd.flatten(), var.flatten()
    n = x.numel() / x.shape[1]
    new_running_mean = momentum * save_mean + (1 - momentum) * running_mean
    new_running_var = momentum * (biased_var * (n / (n - 1))) + (1 - momentum) * running_var
    return output, save_mean, save_rstd, new_running_mean, new_running_var


def layer_norm_low_precision(x: torch.Tensor, shape: list[int], weight: Any, bias: Any, eps: float) -> Any:
    """float16 / bfloat16 layer norm computed in float32 and rounded, as eager's CPU kernel does
    (its statistics come back in the input's dtype): the exporter's translation declares float16
    statistics ONNX's LayerNormalization does not make."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return NotImplemented

    def wide(t: Any) -> Any:
        return None if t is None else t.float()

    out, mean, rstd = _aten.native_layer_norm.default(x.float(), shape, wide(weight), wide(bias), eps)
    return out.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def layer_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: list[int],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Any,
    bias: Any,
    output_mask: list[bool],
) -> Any:
    """``aten.native_layer_norm_backward`` on the CPU (float32/float64) in 8 full-size writes where
    torch's decomposition takes 10 and three row sums: the two row sums of the input gradient
    that carry the weight, ``sum(g * w)`` and ``sum(g * xhat * w)``, are matrix-vector products
    with the weight (``g @ w``, ``(g * xhat) @ w``: one read each, ORT's GEMV about 3x faster
    than its ``Mul`` and ``ReduceSum``), and the input gradient is ``(g * w - xhat * (c / N) - b /
    N) * rstd`` (torch's: ``rstd / N * (N * g * w - b - xhat * c)``, one more pass). Weight and
    bias gradients are sums over the leading axes of ``g * xhat`` and ``g`` (matrix products on
    ORT's CPU provider, ``export.reductions``). Elsewhere (CUDA, whose matrix products may round
    through TF32; other dtypes; empty or symbolic normalized shapes): torch's decomposition."""
    op = torch.ops.aten.native_layer_norm_backward.default
    args = (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    dtype = input.dtype
    n = math.prod(normalized_shape) if all(_concrete(d) for d in normalized_shape) else None
    if (
        dtype not in (torch.float32, torch.float64)
        or input.device.type != "cpu"
        or any(t is not None and t.dtype != dtype for t in (grad_out, weight, bias, mean, rstd))
        or not n
        or input.numel() == 0
    ):
        return _torch_decomposition(op, *args)
    x = input.reshape(-1, n)
    g = grad_out.reshape(-1, n)
    mean, rstd = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    x_hat = (x - mean) * rstd
    d_input = d_weight = d_bias = None
    if weight is not None:
        w = weight.reshape(n, 1)
        g_x_hat = g * x_hat
        if output_mask[1]:
            d_weight = g_x_hat.sum(0).reshape(weight.shape)
        if output_mask[0]:
            b = torch.mm(g, w)
            c = torch.mm(g_x_hat, w)
            g_w = g * w.reshape(n)
    elif output_mask[0]:
        b = g.sum(1, keepdim=True)
        c = (g * x_hat).sum(1, keepdim=True)
        g_w = g
    if output_mask[0]:
        d_input = ((g_w - x_hat * (c / n) - b / n) * rstd).reshape(input.shape)
    if output_mask[2] and bias is not None:
        d_bias = g.sum(0).reshape(bias.shape)
    return d_input, d_weight, d_bias


def weight_norm_interface_backward(
    grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor, saved_norms: torch.Tensor, dim: int
) -> Any:
    """``aten._weight_norm_interface_backward`` (the gradient of ``weight_norm``'s
    ``w = g * v / |v|``, norms over every dim but ``dim``), as PyTorch's differentiable form
    computes it: ``grad_g = sum(grad_w * v) / |v|`` and
    ``grad_v = g / |v| * (grad_w - v * grad_g / |v|)``. wav2vec2's positional convolution."""
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    grad_g = (grad_w * saved_v).sum(dims, keepdim=True) / saved_norms
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g


@_float64_only
def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> Any:
    """The rows ``indices`` names whose norm passes ``max_norm``, scaled by ``max_norm / (norm +
    1e-7)`` as eager's kernel does, with float64 constants (the translation's max_norm was
    float32: 1e-8 off)."""
    flat = indices.reshape(-1)
    rows = weight[flat]
    norms = torch.linalg.vector_norm(rows, norm_type, dim=-1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    return torch.index_put(weight, (flat,), rows * scale)


#: batch, layer and weight normalization (op -> decomposition)
NORMALIZATION_DECOMPOSITIONS: dict[Any, Any] = {
    _aten._native_batch_norm_legit_no_training.default: batch_norm_no_training,
    _aten.native_batch_norm.default: native_batch_norm,
    _aten._native_batch_norm_legit_functional.default: batch_norm_training,
    _aten._native_batch_norm_legit.no_stats: batch_norm_no_stats,
    _aten.native_layer_norm.default: layer_norm_low_precision,
    _aten.native_layer_norm_backward.default: layer_norm_backward,
    _aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    _aten.embedding_renorm.default: embedding_renorm,
}

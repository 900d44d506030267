"""The gradient of a convolution as forward convolutions and matrix products ORT runs.

``aten.convolution_backward`` has no ONNX translation. :func:`convolution_backward` computes the
input gradient as a transposed convolution with the same weight, and the weight gradient as a
matrix product over the unfolded input (small kernels) or as a convolution correlating the input
with the output gradient (larger ones).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from .common import _aten, _concrete

__all__ = ["CONVOLUTION_DECOMPOSITIONS", "convolution_backward"]


def convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> Any:
    """``aten.convolution_backward`` as forward convolutions, which ORT runs (Conv/ConvTranspose).

    Covers non-transposed convolutions of any rank and group count; anything else returns
    ``NotImplemented`` and stays a single op. ``stride``, ``padding`` and ``dilation`` may hold
    one value for every spatial dim (a convolution with ``padding="valid"`` or ``"same"``, as
    Hugging Face's EfficientNet has, records ``[0]``).
    """
    if transposed:
        return NotImplemented
    spatial = input.dim() - 2
    stride, padding, dilation = (list(v) * spatial if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        # the input gradient is a transposed convolution of grad_output with the same weight;
        # output_padding recovers input sizes the strided forward rounded away
        extra = []
        for i in range(spatial):
            covered = (grad_output.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1) + 1
            extra.append(input.shape[2 + i] - covered)
        grad_input = torch.ops.aten.convolution.default(
            grad_output, weight, None, stride, padding, dilation, True, extra, groups
        )
    if output_mask[1]:
        grad_weight = _conv_weight_grad(grad_output, input, weight, stride, padding, dilation, groups)
    if output_mask[2]:
        grad_bias = grad_output.sum(dim=[0, *range(2, grad_output.dim())])
    return grad_input, grad_weight, grad_bias


#: largest kernel (number of taps) whose weight gradient is computed as one matrix product
#: over unfolded input; the copies grow with it
_UNFOLD_MAX_TAPS = 49


def _conv_weight_grad(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> torch.Tensor:
    """The weight gradient of a (non-transposed) convolution.

    Small kernels: the input is unfolded (one strided slice per kernel tap) and the gradient is
    a matrix product per sample and group, summed over the batch; ORT runs this several times
    faster than a convolution whose "kernel" is the whole grad_output. Larger kernels: the
    input correlated with grad_output as a convolution.
    """
    spatial = input.dim() - 2
    n = input.shape[0]
    c_in = input.shape[1] // groups
    c_out = grad_output.shape[1] // groups
    kernel = list(weight.shape[2:])
    out_sizes = list(grad_output.shape[2:])
    taps = math.prod(kernel)
    if taps <= _UNFOLD_MAX_TAPS and _concrete(n, *out_sizes, *input.shape[2:]):
        x = input
        if any(padding):
            pads: list[int] = []
            for p in reversed(padding):
                pads += [p, p]
            x = torch.ops.aten.constant_pad_nd.default(x, pads, 0.0)
        cols = []
        for offsets in itertools.product(*(range(k) for k in kernel)):
            piece = x
            for i, k_i in enumerate(offsets):
                start = k_i * dilation[i]
                piece = torch.ops.aten.slice.Tensor(piece, 2 + i, start, start + stride[i] * (out_sizes[i] - 1) + 1, stride[i])
            cols.append(piece)
        positions = math.prod(out_sizes)
        # per sample and group: [Co, P] x [P, Ci*taps], then summed over the batch; the bmm of
        # a transposed view lets ORT fold the transpose into its GEMM (no copy)
        unfolded = torch.stack(cols, 2).reshape(n * groups, c_in * taps, positions)
        g = grad_output.reshape(n * groups, c_out, positions)
        gw = torch.bmm(g, unfolded.transpose(1, 2)).reshape(n, groups * c_out, c_in * taps)
        return gw.sum(0).reshape(groups * c_out, c_in, *kernel)
    # correlate input with grad_output over the batch: swap batch and channel axes, per group
    x = input.reshape(n, groups, c_in, *input.shape[2:]).transpose(0, 2)
    x = x.reshape(c_in, groups * n, *input.shape[2:])
    sp = list(range(3, 3 + spatial))
    g = grad_output.reshape(n, groups, c_out, *grad_output.shape[2:]).permute(1, 2, 0, *sp)
    g = g.reshape(groups * c_out, n, *grad_output.shape[2:])
    gw = torch.ops.aten.convolution.default(x, g, None, dilation, padding, stride, False, [0] * spatial, groups)
    gw = gw.reshape(c_in, groups * c_out, *gw.shape[2:]).transpose(0, 1)
    for i in range(spatial):
        gw = gw.narrow(2 + i, 0, weight.shape[2 + i])
    return gw.contiguous()


#: convolution gradients (op -> decomposition)
CONVOLUTION_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.convolution_backward.default: convolution_backward,
}

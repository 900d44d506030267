"""Average pooling's divisor and gradients in ops ORT runs; max pooling without unread indices.

``avg_pool2d``/``avg_pool3d`` with ``divisor_override`` (which the translation ignores), their
gradients and ``_adaptive_avg_pool2d_backward`` (no translation): each window's divisor as eager
counts it, gradients spread over their windows by transposed convolutions with kernels of ones
or by products with 0/1 window matrices. :func:`drop_unused_indices` turns max pooling whose
indices nobody reads into plain pooling.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .common import _aten, _concrete

__all__ = ["POOLING_DECOMPOSITIONS", "drop_unused_indices"]


def _pool_geometry(spatial: int, kernel_size: Any, stride: Any, padding: Any) -> tuple[list[int], list[int], list[int]]:
    """Kernel, stride and padding of an average pooling, one entry per spatial dim."""

    def per_dim(v: Any, default: Any) -> list[int]:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        v = v or list(default)
        return v * spatial if len(v) == 1 else v

    kernel = per_dim(kernel_size, ())
    return kernel, per_dim(stride, kernel), per_dim(padding, (0,))


def _window_sizes(
    x: torch.Tensor, out_shape: Any, geometry: tuple[list[int], list[int], list[int]], include_pad: bool
) -> torch.Tensor:
    """Eager's divisor of every average-pooling window (broadcast over the spatial dims): its
    extent clipped to the padded input, or without ``include_pad`` to the input itself."""
    kernel, strides, pads = geometry
    spatial = len(kernel)
    factor = torch.ones((), dtype=x.dtype, device=x.device)
    for i in range(spatial):
        size, out = x.shape[x.dim() - spatial + i], out_shape[len(out_shape) - spatial + i]
        start = torch.arange(out, device=x.device) * strides[i] - pads[i]  # window o: [start, end)
        end = (start + kernel[i]).clamp_max(size + pads[i])
        if include_pad:
            counts = end - start
        else:
            counts = end.clamp_max(size) - start.clamp_min(0)
        shape = [1] * spatial
        shape[i] = out
        factor = factor * counts.to(x.dtype).reshape(shape)
    return factor


def _avg_pool_divided_by(op: Any, spatial: int) -> Any:
    """``avg_pool2d``/``avg_pool3d`` with ``divisor_override`` (which the translation ignores):
    the average with padding counted, times each window's size (eager's: clipped to the padded
    input, which ``ceil_mode`` windows can pass), divided by the divisor."""

    def decompose(
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> Any:
        if divisor_override is None or not x.is_floating_point():
            return NotImplemented
        geometry = _pool_geometry(spatial, kernel_size, stride, padding)
        average = op(x, *geometry, ceil_mode, True, None)
        return average * _window_sizes(x, average.shape, geometry, True) / divisor_override

    return decompose


def _avg_pool_backward(spatial: int) -> Any:
    """``avg_pool2d_backward``/``avg_pool3d_backward`` (no translation): each output gradient
    divided by its window's divisor, spread over its window by a transposed convolution with a
    kernel of ones (stride of the pooling, no padding), then cut to the input (the padding off).

    The kernel is cut to the padded input first (``min(kernel, padding + size)`` per dim): a
    window's part beyond it lands past the input, where the cut drops it. A pooling window far
    larger than its input (Hugging Face's EfficientNet pools globally with ``AvgPool2d(1280,
    ceil_mode=True)``) otherwise spread every gradient over the whole kernel: [2560, 1, 1280,
    1280] floats, 17 GB and 5 s per step, for a 2 x 1280 x 7 x 7 input."""
    transpose = F.conv_transpose2d if spatial == 2 else F.conv_transpose3d

    def decompose(
        grad: torch.Tensor,
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
    ) -> Any:
        if not grad.is_floating_point() or grad.dim() != spatial + 2:
            return NotImplemented
        kernel, strides, pads = geometry = _pool_geometry(spatial, kernel_size, stride, padding)
        if divisor_override is not None:
            scaled = grad / divisor_override
        else:
            scaled = grad / _window_sizes(x, grad.shape, geometry, count_include_pad)
        lead, out = scaled.shape[:2], scaled.shape[2:]
        reach = [min(k, p + size) for k, p, size in zip(kernel, pads, x.shape[2:])]
        ones = torch.ones([1, 1, *reach], dtype=grad.dtype, device=grad.device)
        spread = transpose(scaled.reshape(-1, 1, *out), ones, stride=strides)
        for i in range(spatial):
            size, dim = x.shape[2 + i], 2 + i
            short = pads[i] + size - spread.shape[dim]
            if short > 0:
                spread = F.pad(spread, [0, 0] * (spatial - 1 - i) + [0, short])
            spread = spread.narrow(dim, pads[i], size)
        return spread.reshape(*lead, *x.shape[2:])

    return decompose


def adaptive_avg_pool2d_backward(grad: torch.Tensor, x: torch.Tensor) -> Any:
    """``aten._adaptive_avg_pool2d_backward``. When the input divides into equal windows, each
    input element gets its window's gradient divided by the window height, then width (the
    order PyTorch's kernel divides in, so results are bit-identical). Otherwise the windows
    differ in size and may overlap (VGG's pooling to 7 x 7 from 8 x 8 or 1 x 1): the gradient is
    divided by each window's size and spread over its rows and columns by two products with
    0/1 window matrices (sums in another order than the kernel's: equal within rounding)."""
    *lead, h, w = x.shape
    oh, ow = grad.shape[-2:]
    if not _concrete(h, w, oh, ow, *lead) or oh == 0 or ow == 0 or not grad.is_floating_point():
        return NotImplemented
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        g = grad / kh / kw
        return g.reshape(*lead, oh, 1, ow, 1).expand(*lead, oh, kh, ow, kw).reshape(*lead, h, w)
    rows, heights = _pool_windows(h, oh, grad)
    cols, widths = _pool_windows(w, ow, grad)
    g = grad / heights.unsqueeze(-1) / widths
    return rows @ g @ cols.t()


def _pool_windows(size: int, out: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive pooling's windows along one axis: a [size, out] matrix, 1 where input element
    ``j`` lies in window ``i`` (``floor(i * size / out) <= j < ceil((i + 1) * size / out)``), and
    each window's length."""
    i = torch.arange(out, device=like.device)
    start = torch.div(i * size, out, rounding_mode="floor")
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode="floor")
    j = torch.arange(size, device=like.device).unsqueeze(-1)
    inside = (j >= start) & (j < end)
    return inside.to(like.dtype), (end - start).to(like.dtype)


#: pooling ops with an indices output, and their index-free form
_POOL_WITHOUT_INDICES = {
    _aten.max_pool2d_with_indices.default: _aten.max_pool2d.default,
    _aten.max_pool3d_with_indices.default: _aten.max_pool3d.default,
}


def drop_unused_indices(gm: torch.fx.GraphModule) -> int:
    """Max pooling with indices becomes plain max pooling where the indices are unused
    (inference): the exporter computes torch-style indices with a second pooling and index
    arithmetic otherwise. In place; returns how many were replaced."""
    replaced = 0
    for node in list(gm.graph.nodes):
        plain = _POOL_WITHOUT_INDICES.get(node.target) if node.op == "call_function" else None
        if plain is None:
            continue
        users = list(node.users)
        if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
            continue
        if any(u.args[1] != 0 and u.users for u in users):
            continue  # the indices are used (training: the backward reads them)
        val = node.meta.get("val")
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(plain, node.args, node.kwargs)
        new.meta = dict(node.meta)
        if isinstance(val, (tuple, list)):
            new.meta["val"] = val[0]
        for u in users:
            u.replace_all_uses_with(new)
            gm.graph.erase_node(u)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


#: average pooling with a divisor, and pooling gradients (op -> decomposition)
POOLING_DECOMPOSITIONS: dict[Any, Any] = {
    _aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool2d_backward,
    _aten.avg_pool2d.default: _avg_pool_divided_by(_aten.avg_pool2d.default, 2),
    _aten.avg_pool3d.default: _avg_pool_divided_by(_aten.avg_pool3d.default, 3),
    _aten.avg_pool2d_backward.default: _avg_pool_backward(2),
    _aten.avg_pool3d_backward.default: _avg_pool_backward(3),
}

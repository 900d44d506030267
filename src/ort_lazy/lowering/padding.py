"""Replication padding as gathers of clamped positions; ``im2col`` of empty inputs.

The translation of ``replication_pad1d/2d/3d`` is ONNX ``Pad`` in edge mode, which ORT rejects
at run time for negative amounts (a crop, which eager allows), and the backward ops have no
translation. Here each padded dim is an ``index_select`` of the positions
``clamp(i - before, 0, size - 1)``: positive amounts repeat the edge, negative ones crop. The
gradient adds every output position's gradient into the input position it was taken from
(``index_add``), dim by dim in reverse.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PADDING_DECOMPOSITIONS"]

_aten = torch.ops.aten


def _positions(size: int, before: int, after: int, device: torch.device) -> torch.Tensor:
    """The input position each output position along one dim repeats."""
    return (torch.arange(size + before + after, device=device) - before).clamp(0, size - 1)


def _amounts(x: torch.Tensor, padding: list[int], spatial: int) -> list[tuple[int, int, int]] | None:
    """(dim, before, after) per padded dim, or None when eager would not pad ``x`` so."""
    if len(padding) != 2 * spatial or x.dim() < spatial + 1:
        return None
    out = []
    for i in range(spatial):
        dim = x.dim() - 1 - i
        before, after = int(padding[2 * i]), int(padding[2 * i + 1])
        size = x.shape[dim]
        if size == 0 or size + before + after <= 0 or before < -size or after < -size:
            return None
        out.append((dim, before, after))
    return out


def _replication_pad(spatial: int) -> Any:
    def decompose(x: torch.Tensor, padding: list[int]) -> Any:
        amounts = _amounts(x, padding, spatial)
        if amounts is None or x.is_complex():
            return NotImplemented
        for dim, before, after in amounts:
            x = x.index_select(dim, _positions(x.shape[dim], before, after, x.device))
        return x

    decompose.__doc__ = f"``replication_pad{spatial}d`` as gathers (negative amounts crop)."
    return decompose


def _replication_pad_backward(spatial: int) -> Any:
    def decompose(grad: torch.Tensor, x: torch.Tensor, padding: list[int]) -> Any:
        amounts = _amounts(x, padding, spatial)
        if amounts is None or not grad.is_floating_point():
            return NotImplemented
        shapes = [list(x.shape)]
        for dim, before, after in amounts[:-1]:
            shape = list(shapes[-1])
            shape[dim] += before + after
            shapes.append(shape)
        for (dim, before, after), shape in zip(reversed(amounts), reversed(shapes)):
            positions = _positions(shape[dim], before, after, grad.device)
            grad = torch.zeros(shape, dtype=grad.dtype, device=grad.device).index_add(dim, positions, grad)
        return grad

    decompose.__doc__ = f"``replication_pad{spatial}d_backward``: gradients added back per dim."
    return decompose


def empty_im2col(x: torch.Tensor, kernel_size: list[int], dilation: list[int], padding: list[int], stride: list[int]) -> Any:
    """``im2col`` (``F.unfold``) of an empty input: the empty result of eager's shape (ORT
    refused to create a session for the translation's graph then)."""
    if x.numel() != 0:
        return NotImplemented
    blocks = 1
    for size, k, d, p, s in zip(x.shape[-2:], kernel_size, dilation, padding, stride):
        blocks *= (size + 2 * p - d * (k - 1) - 1) // s + 1
    columns = x.shape[-3] * kernel_size[0] * kernel_size[1]
    return x.new_zeros((*x.shape[:-3], columns, blocks))


#: replication padding and its gradient, im2col of empty inputs (op -> decomposition)
PADDING_DECOMPOSITIONS: dict[Any, Any] = {
    **{getattr(_aten, f"replication_pad{n}d").default: _replication_pad(n) for n in (1, 2, 3)},
    **{getattr(_aten, f"replication_pad{n}d_backward").default: _replication_pad_backward(n) for n in (1, 2, 3)},
    _aten.im2col.default: empty_im2col,
}

"""Writes into a slice, and cuts into slices, as concatenations and narrows.

The exporter translates ``select_scatter``, ``slice_scatter`` and the gradients of ``select`` and
``slice`` as scatters (ScatterElements with an index tensor), which cost ORT about 10x a copy:
here each is one concatenation of [before, src, after] (:func:`_cat_into`), exact. ``split`` and
``split_with_sizes`` become slices (the exporter's SplitToSequence is slower, and with sizes
ill-typed for ONNX type inference).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import _aten, _concrete, _torch_decomposition
from .indexing import in_layout_of

__all__ = ["SLICE_DECOMPOSITIONS"]


def _cat_into(base: torch.Tensor | None, like: torch.Tensor, sizes: Any, dim: int, start: Any, src: torch.Tensor) -> torch.Tensor:
    """``base`` (zeros of ``sizes`` when None) with ``src`` written at ``start`` along ``dim``.

    Built as one concatenation of [before, src, after]: ORT copies memory for it, where the
    exporter's scatter translations (ScatterElements with an index tensor) cost ~10x more. The
    result is contiguous, as the ``*_backward`` ops make theirs (from zeros); the scatters lay
    it out as their ``base`` (:func:`~.indexing.in_layout_of`).
    """
    size = sizes[dim]
    length = src.shape[dim]
    rest = size - start - length

    def piece(offset: Any, count: Any) -> torch.Tensor:
        if base is not None:
            return base.narrow(dim, offset, count)
        shape = list(sizes)
        shape[dim] = count
        return like.new_zeros(shape)

    pieces = []
    if not (_concrete(start) and start == 0):
        pieces.append(piece(0, start))
    pieces.append(src)
    if not (_concrete(rest) and rest == 0):
        pieces.append(piece(start + length, rest))
    if len(pieces) == 1:
        return src.clone(memory_format=torch.contiguous_format)
    return torch.cat(pieces, dim).contiguous()


def _slice_start(start: Any, size: Any) -> Any:
    """``start`` of ``x[start:]`` along a dim of ``size`` as aten normalizes it, or None if unknown."""
    if start is None:
        return 0
    if not _concrete(start, size):
        return None
    if start < 0:
        start += size
    return min(max(start, 0), size)


def select_scatter(base: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> Any:
    """``aten.select_scatter`` as a concatenation (exact), laid out as ``base`` as eager's is
    (a concatenation's own layout failed the trace of a later ``view`` that eager's allows:
    Hugging Face's Funnel Transformer ran wholly in PyTorch)."""
    dim %= base.dim()
    if not _concrete(index):
        return NotImplemented
    if index < 0:
        index += base.shape[dim]
    return in_layout_of(_cat_into(base, base, base.shape, dim, index, src.unsqueeze(dim)), base)


def select_backward(grad: torch.Tensor, input_sizes: list[int], dim: int, index: int) -> Any:
    """``aten.select_backward``: ``grad`` placed between zeros (exact)."""
    dim %= len(input_sizes)
    if not _concrete(index):
        return _torch_decomposition(torch.ops.aten.select_backward.default, grad, input_sizes, dim, index)
    if index < 0:
        index += input_sizes[dim]
    return _cat_into(None, grad, input_sizes, dim, index, grad.unsqueeze(dim))


def slice_scatter(base: torch.Tensor, src: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """``aten.slice_scatter`` with step 1 as a concatenation (exact), laid out as ``base`` (see
    :func:`select_scatter`); other steps unchanged."""
    dim %= base.dim()
    begin = _slice_start(start, base.shape[dim])
    if step != 1 or begin is None:
        return NotImplemented
    return in_layout_of(_cat_into(base, base, base.shape, dim, begin, src), base)


def slice_backward(grad: torch.Tensor, input_sizes: list[int], dim: int, start: Any, end: Any, step: int) -> Any:
    """``aten.slice_backward`` with step 1: ``grad`` placed between zeros (exact); other cases
    (strides, symbolic sizes) as PyTorch decomposes them."""
    dim %= len(input_sizes)
    begin = _slice_start(start, input_sizes[dim])
    if step != 1 or begin is None:
        return _torch_decomposition(torch.ops.aten.slice_backward.default, grad, input_sizes, dim, start, end, step)
    return _cat_into(None, grad, input_sizes, dim, begin, grad)


def split(x: torch.Tensor, split_size: int, dim: int = 0) -> Any:
    """``aten.split.Tensor`` (and ``unsafe_split``) as slices: the exporter's SplitToSequence +
    SequenceAt is slower."""
    dim %= x.dim()
    size = x.shape[dim]
    if not _concrete(split_size, size) or split_size <= 0:
        return NotImplemented
    return [x.narrow(dim, i, min(split_size, size - i)) for i in range(0, size, split_size)] or [x]


def split_with_sizes(x: torch.Tensor, split_sizes: list[int], dim: int = 0) -> Any:
    """``aten.split_with_sizes`` (and ``unsafe_split_with_sizes``) as slices: the exporter's
    SplitToSequence translation is ill-typed for ONNX type inference."""
    dim %= x.dim()
    if not _concrete(*split_sizes):
        return NotImplemented
    out, start = [], 0
    for size in split_sizes:
        out.append(x.narrow(dim, start, size))
        start += size
    return out


#: slice writes and splits as concatenations and narrows (op -> decomposition)
SLICE_DECOMPOSITIONS: dict[Any, Any] = {
    _aten.select_scatter.default: select_scatter,
    _aten.select_backward.default: select_backward,
    _aten.slice_scatter.default: slice_scatter,
    _aten.slice_backward.default: slice_backward,
    _aten.split.Tensor: split,
    _aten.unsafe_split.Tensor: split,
    _aten.split_with_sizes.default: split_with_sizes,
    _aten.unsafe_split_with_sizes.default: split_with_sizes,
}

"""``as_strided`` calls rewritten to address a tensor in its storage order, which ORT can see.

``as_strided(x, size, stride, offset)`` reads ``x``'s *storage*: its result depends on how eager
laid ``x`` out in memory, not only on ``x``'s values. ORT (and PyTorch, when it runs an op on a
region's output) sees a row-major tensor, so the same call reads other elements wherever eager's
layout is not row-major: a transposed view (``x.t().as_strided(...)``), a channels-last
convolution's output, a slice (its storage starts before it). Found by hand:
``x.t().as_strided((3, 2), (1, 3))`` returned ``[0, 8, 6, 4, 2, 10]`` for eager's
``[0, 6, 2, 8, 4, 10]``, silently. The strides of the graph's fake tensors are eager's, so the
graph says which layout each call addresses, and :func:`storage_order_views` makes every call
address a fresh row-major tensor, whose layout is the same in eager, on ORT and in PyTorch:

- a chain of views over a tensor (``t``, ``slice``, ``expand`` ...) shares that tensor's
  storage, and ``as_strided`` ignores the views' own geometry: the call reads the chain's root;
- a root whose layout is dense but not row-major (permuted: channels-last, a transposed result;
  or starting at an offset: a graph input that is a slice) is copied into its storage order
  (``permute``, contiguous ``clone``) and the call's offset made relative to it;
- ``as_strided_scatter(x, src, ...)`` writes by storage position into a copy of ``x``: for a
  dense ``x`` not in row-major order, it writes into ``x``'s storage-order copy and the result
  is permuted back.

A call that addresses memory no dense tensor of the graph holds (reading around a non-dense
input, writing outside a view) raises :class:`LayoutError`: the graph runs in PyTorch, which
reads the real memory (counted and warned as a graph that could not be compiled).
:func:`ort_lazy.export.strided.layout_problem` is the check behind the translations: any call
left that is not row-major (symbolic sizes) stays in PyTorch.
"""

from __future__ import annotations

import math

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..export.strided import last_position, storage_order
from .simplify import _val

__all__ = ["storage_order_views", "LayoutError"]

aten = torch.ops.aten

_SCATTERS = {aten.as_strided_scatter.default, torch.ops.prims.as_strided_scatter.default}


class LayoutError(RuntimeError):
    """An ``as_strided`` call addresses memory no tensor of the graph holds in an order ORT
    can reproduce; the graph runs in PyTorch, which reads the real memory."""


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return False


def _view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor whose storage ``node`` views, through a chain of aten view ops."""
    while (
        node.op == "call_function"
        and getattr(node.target, "is_view", False)
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
    ):
        val, source = _val(node), _val(node.args[0])
        if val is None or source is None or not _same_storage(val, source):
            break
        node = node.args[0]
    return node


def _row_major(val: torch.Tensor) -> bool:
    """Whether ``val``'s elements lie in memory in row-major order from the storage's start."""
    return val.storage_offset() == 0 and val.is_contiguous()


def _holds(val: torch.Tensor, first: int, last: int) -> bool:
    """Whether the storage positions ``first..last`` all hold elements of the dense ``val``."""
    return val.storage_offset() <= first and last < val.storage_offset() + val.numel()


def _dense_copy(gm: torch.fx.GraphModule, node: torch.fx.Node, order: list[int], before: torch.fx.Node) -> torch.fx.Node:
    """A fresh row-major tensor holding ``node``'s elements in their storage order."""
    val = _val(node)
    assert val is not None
    with gm.graph.inserting_before(before):
        source = node
        if order != sorted(order):
            source = gm.graph.call_function(aten.permute.default, (node, order))
            source.meta["val"] = val.permute(order)
        dense = gm.graph.call_function(aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
        dense.meta["val"] = source.meta["val"].clone(memory_format=torch.contiguous_format)
    return dense


def _addressed(node: torch.fx.Node, source: torch.Tensor) -> tuple[list[int], list[int], int, int, int] | None:
    """(size, stride, offset, first, last position) of a static ``as_strided`` or
    ``as_strided_scatter`` call (the offset made explicit: None is the input's own); None when
    symbolic or empty."""
    at = 2 if node.target in _SCATTERS else 1  # a scatter's source comes before the sizes
    size, stride = list(node.args[at]), list(node.args[at + 1])
    offset = node.args[at + 2] if len(node.args) > at + 2 else node.kwargs.get("storage_offset")
    if offset is None:
        offset = source.storage_offset()
    numbers = [*size, *stride, offset, *source.shape, *source.stride(), source.storage_offset()]
    if not all(type(v) is int for v in numbers) or math.prod(size) == 0:
        return None
    if any(s < 0 for s in stride):
        raise LayoutError(f"as_strided with negative strides {stride}")
    return size, stride, offset, offset, last_position(size, stride, offset)


def storage_order_views(gm: torch.fx.GraphModule) -> int:
    """Rewrite the graph's ``as_strided`` and ``as_strided_scatter`` calls to address fresh
    row-major tensors (see the module's docstring). In place; returns how many changed.

    Raises:
        LayoutError: a call addresses memory the rewrite cannot reproduce (the caller runs the
            graph in PyTorch).
    """
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.as_strided.default:
            changed += _rewrite_read(gm, node)
        elif node.target in _SCATTERS:
            changed += _rewrite_scatter(gm, node)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _off_row_major(node: torch.fx.Node) -> tuple[torch.Tensor, tuple[list[int], list[int], int, int, int]] | None:
    """(the input's fake tensor, what the call addresses) of an ``as_strided`` or
    ``as_strided_scatter`` call the translation's row-major reading would get wrong; None when
    it gets it right, or the call is symbolic (the support check keeps it in PyTorch)."""
    val = _val(node.args[0])
    addressed = None if val is None else _addressed(node, val)
    if val is None or addressed is None or (_row_major(val) and addressed[4] < val.numel()):
        return None
    return val, addressed


def _rewrite_read(gm: torch.fx.GraphModule, node: torch.fx.Node) -> int:
    found = _off_row_major(node)
    if found is None:
        return 0
    source = node.args[0]
    source_val, (size, stride, offset, first, last) = found
    root = _view_root(source)
    root_val = _val(root)
    assert root_val is not None
    order = storage_order(root_val)
    if order is None or not _holds(root_val, first, last):
        raise LayoutError(
            f"as_strided{tuple(size), tuple(stride), offset} reads memory around its input "
            f"(strides {tuple(source_val.stride())}, offset {source_val.storage_offset()})"
        )
    new_input = root if _row_major(root_val) else _dense_copy(gm, root, order, node)
    node.args = (new_input, size, stride, offset - root_val.storage_offset())
    node.kwargs = {}
    return 1


def _rewrite_scatter(gm: torch.fx.GraphModule, node: torch.fx.Node) -> int:
    found = _off_row_major(node)
    if found is None:
        return 0
    base = node.args[0]
    base_val, (size, stride, offset, first, last) = found
    order = storage_order(base_val)
    if order is None or not _holds(base_val, first, last):
        # eager writes by storage position into a copy of a view: writes outside it are dropped
        raise LayoutError(
            f"as_strided_scatter{tuple(size), tuple(stride), offset} writes around its input "
            f"(strides {tuple(base_val.stride())}, offset {base_val.storage_offset()})"
        )
    dense = _dense_copy(gm, base, order, node)
    inverse = [order.index(d) for d in range(len(order))]
    with gm.graph.inserting_before(node):
        scattered = gm.graph.call_function(node.target, (dense, node.args[1], size, stride, offset - base_val.storage_offset()))
        scattered.meta["val"] = dense.meta["val"].clone()
        back = scattered
        if order != sorted(order):
            back = gm.graph.call_function(aten.permute.default, (scattered, inverse))
            back.meta["val"] = scattered.meta["val"].permute(inverse)
    node.replace_all_uses_with(back)
    gm.graph.erase_node(node)
    return 1

"""Aten graph clean-ups that remove work ORT would do and eager does not.

- **Expands to the input's own shape**: the decomposition of ``matmul`` expands both operands
  to their broadcast shape before ``bmm``; when nothing broadcasts, eager's ``expand`` is a
  free view but ORT's ``Expand`` copies the tensor (0.5 ms for the attention probabilities of
  a TransformerEncoderLayer's backward, four per layer).
- **Sums of zero-padded concatenations**: the backward of ``unbind``/``select`` (a packed
  query/key/value projection split in three) places each gradient in zeros and concatenates,
  then adds the three: ``cat([0, 0, g2]) + cat([0, g1, 0]) + cat([g0, 0, 0])``. When no two
  non-zero pieces overlap, that is one ``cat([g0, g1, g2])``: 3 concatenations, 4 zero fills
  and 2 additions of the whole tensor become one concatenation.
- **Sizes of computed tensors** rebuilt as integer arithmetic on the graph inputs' sizes
  (:func:`sizes_from_inputs`), so a region does not end where PyTorch reads a size.
- **The empty statistics of eval-mode batch norm** (saved for a backward that does not read
  them) are made in PyTorch, where the translation would give them per-channel values.

:func:`simplify_aten` runs them all, in place, on any aten graph before it is partitioned (the
values they leave without users are left to dead-code elimination). One difference from eager
is kept on purpose: eager's ``g + 0.0`` turns a ``-0.0`` gradient element into ``+0.0``; the
merged ``cat`` keeps ``-0.0`` (equal values, as every comparison but ``signbit`` sees them).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

__all__ = ["simplify_aten", "drop_noop_expands", "merge_disjoint_cats", "sizes_from_inputs", "empty_batch_norm_statistics"]

aten = torch.ops.aten

_ZERO_FILLS = {aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default}
_FILLS = {aten.full.default: 1, aten.new_full.default: 2, aten.full_like.default: 1}


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _static(shape: Any) -> bool:
    return all(isinstance(d, int) for d in shape)


def drop_noop_expands(gm: torch.fx.GraphModule) -> int:
    """Point the uses of ``expand`` to the input's own (static) shape at the input. In place."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.expand.default:
            continue
        src, out = _val(node.args[0]), _val(node)
        if src is None or out is None or not _static(src.shape) or tuple(src.shape) != tuple(out.shape):
            continue
        if any(user.op != "output" for user in node.users):
            node.replace_all_uses_with(node.args[0], lambda user: user.op != "output")
            dropped += 1
    if dropped:
        gm.recompile()
    return dropped


def _is_zero(node: Any) -> bool:
    """Whether ``node`` is a tensor of zeros made by a fill op."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target in _ZERO_FILLS:
        return True
    index = _FILLS.get(node.target)
    if index is None or len(node.args) <= index:
        return False
    value = node.args[index]
    return isinstance(value, (int, float, bool)) and value == 0 and math.copysign(1.0, value) > 0


def _pieces(node: Any, dim: int) -> list[tuple[int, int, Any]] | None:
    """``(start, end, piece or None for zeros)`` along ``dim`` for a ``cat`` node, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target is not aten.cat.default:
        return None
    out = _val(node)
    if out is None or not _static(out.shape):
        return None
    cat_dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if cat_dim % out.dim() != dim:
        return None
    pieces, start = [], 0
    for piece in node.args[0]:
        val = _val(piece)
        if val is None or val.dim() != out.dim() or val.dtype != out.dtype or not _static(val.shape):
            return None
        end = start + val.shape[dim]
        if end > start:
            pieces.append((start, end, None if _is_zero(piece) else piece))
        start = end
    return pieces if start == out.shape[dim] else None


def _merged(a: list[tuple[int, int, Any]], b: list[tuple[int, int, Any]]) -> list[tuple[int, int, Any]] | None:
    """The pieces of ``cat(a) + cat(b)`` when their non-zero pieces never overlap, else None."""
    bounds = sorted({s for s, _, _ in a} | {e for _, e, _ in a} | {s for s, _, _ in b} | {e for _, e, _ in b})
    out: list[tuple[int, int, Any]] = []
    for lo, hi in zip(bounds, bounds[1:]):
        pa = next(p for s, e, p in a if s <= lo and hi <= e)
        pb = next(p for s, e, p in b if s <= lo and hi <= e)
        if pa is not None and pb is not None:
            return None
        piece = pa if pa is not None else pb
        if out and out[-1][2] is piece:  # the same piece (or zeros) goes on
            out[-1] = (out[-1][0], hi, piece)
        else:
            out.append((lo, hi, piece))
    # every non-zero piece must come out whole (in one run)
    whole = {id(p): (s, e) for s, e, p in a + b if p is not None}
    if any(p is not None and whole[id(p)] != (s, e) for s, e, p in out):
        return None
    return out


def merge_disjoint_cats(gm: torch.fx.GraphModule) -> int:
    """Replace ``cat(a) + cat(b)`` by one ``cat`` when the non-zero pieces never overlap.

    Zeros that remain (places neither side fills) become one zero fill per gap. In place;
    returns the number of additions replaced.
    """
    merged = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.add.Tensor or node.kwargs or len(node.args) != 2:
            continue
        out = _val(node)
        a, b = node.args
        va, vb = _val(a), _val(b)
        if out is None or va is None or vb is None or not _static(out.shape):
            continue
        if any(v.shape != out.shape or v.dtype != out.dtype for v in (va, vb)):
            continue
        result = None
        for dim in range(out.dim()):
            pa, pb = _pieces(a, dim), _pieces(b, dim)
            if pa is not None and pb is not None:
                result = _merged(pa, pb)
                if result is not None:
                    break
        if result is None:
            continue
        args = []
        with gm.graph.inserting_before(node):
            for start, end, piece in result:
                if piece is None:
                    shape = list(out.shape)
                    shape[dim] = end - start
                    piece = gm.graph.call_function(aten.zeros.default, (shape,), {"dtype": out.dtype, "device": out.device})
                    piece.meta["val"] = out.new_zeros(shape)
                args.append(piece)
            cat = gm.graph.call_function(aten.cat.default, (args, dim))
        cat.meta = dict(node.meta)
        node.replace_all_uses_with(cat)
        gm.graph.erase_node(node)
        merged += 1
    if merged:
        gm.recompile()
    return merged


def _input_symbols(gm: torch.fx.GraphModule) -> dict[Any, tuple[torch.fx.Node, int | None]]:
    """symbol -> (placeholder, dim) where an input's size is that symbol (dim None: the input
    is the symbolic integer itself)."""
    sources: dict[Any, tuple[torch.fx.Node, int | None]] = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            sources.setdefault(val.node.expr, (node, None))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    sources.setdefault(size.node.expr, (node, d))
    return sources


def _combination(expr: Any) -> tuple[Any, list[Any]] | None:
    """(operator, operands) of an integer expression node :func:`sizes_from_inputs` rebuilds:
    a sum, product, integer power, floor division or remainder; None for any other."""
    from torch.utils._sympy.functions import FloorDiv, Mod

    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 1:
        return operator.mul, [expr.base] * int(expr.exp)
    if expr.is_Add or expr.is_Mul:
        return (operator.add if expr.is_Add else operator.mul), list(expr.args)
    if isinstance(expr, (FloorDiv, Mod)):
        return (operator.floordiv if isinstance(expr, FloorDiv) else operator.mod), list(expr.args)
    return None


def _rebuildable(expr: Any, sources: dict[Any, Any]) -> bool:
    """Whether ``expr`` is integers and input symbols joined by :func:`_combination`'s operators."""
    if expr.is_Integer:
        return True
    if expr.is_Symbol:
        return expr in sources
    combination = _combination(expr)
    return combination is not None and all(_rebuildable(arg, sources) for arg in combination[1])


def _build_size(gm: torch.fx.GraphModule, expr: Any, sources: dict[Any, Any], before: torch.fx.Node, built: dict[Any, Any]) -> Any:
    """FX nodes computing the :func:`_rebuildable` expression ``expr`` from the graph's inputs,
    inserted before ``before``; ``built`` holds the (sub)expressions made so far in this pass,
    which later sizes reuse."""
    if expr.is_Integer:
        return int(expr)
    if expr in built:
        return built[expr]
    if expr.is_Symbol:
        node, dim = sources[expr]
        if dim is None:
            return node
        with gm.graph.inserting_before(before):
            out = gm.graph.call_function(aten.sym_size.int, (node, dim))
        out.meta["val"] = node.meta["val"].shape[dim]
    else:
        combine, args = _combination(expr)  # type: ignore[misc]
        terms = [_build_size(gm, arg, sources, before, built) for arg in args]
        out = terms[0]
        for term in terms[1:]:
            value = combine(_size_value(out), _size_value(term))
            with gm.graph.inserting_before(before):
                out = gm.graph.call_function(combine, (out, term))
            out.meta["val"] = value
    built[expr] = out
    return out


def _size_value(term: Any) -> Any:
    return term.meta["val"] if isinstance(term, torch.fx.Node) else term


def sizes_from_inputs(gm: torch.fx.GraphModule) -> int:
    """Compute ``sym_size`` of computed tensors from the inputs' sizes instead (see the module
    docstring), so the size no longer needs the tensor in PyTorch. In place; returns how many."""
    sources: dict[Any, Any] | None = None
    built: dict[Any, Any] = {}
    moved = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.sym_size.int:
            continue
        if not isinstance(node.args[0], torch.fx.Node) or node.args[0].op == "placeholder":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt):
            continue
        if sources is None:
            sources = _input_symbols(gm)
        expr = val.node.expr
        if expr.is_Integer or not _rebuildable(expr, sources):
            continue  # an integer would be a static size: such a node is not symbolic
        node.replace_all_uses_with(_build_size(gm, expr, sources, node, built))
        gm.graph.erase_node(node)
        moved += 1
    if moved:
        gm.recompile()
    return moved


def empty_batch_norm_statistics(gm: torch.fx.GraphModule) -> int:
    """Make the empty statistics of eval-mode batch norm in PyTorch. In place.

    ``_native_batch_norm_legit_no_training`` returns a saved mean and inverse deviation of
    shape ``[0]`` on the CPU; in a training graph of a model in eval mode (a classifier fine-tuned
    with frozen batch norm) AOTAutograd saves them for the backward, which does not read them.
    ONNX's BatchNormalization has no such outputs and the translation makes per-channel ones, so
    the region failed its shape check and ran in PyTorch. Each use now reads an empty tensor.
    """
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not operator.getitem:
            continue
        source, index = node.args
        if not isinstance(source, torch.fx.Node) or source.target is not aten._native_batch_norm_legit_no_training.default:
            continue
        val = _val(node)
        if index not in (1, 2) or val is None or tuple(val.shape) != (0,):
            continue
        with gm.graph.inserting_after(node):
            empty = gm.graph.call_function(aten.empty.memory_format, ([0],), {"dtype": val.dtype, "device": val.device})
        empty.meta["val"] = val
        node.replace_all_uses_with(empty)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def simplify_aten(gm: torch.fx.GraphModule) -> int:
    """Run the clean-ups of this module on ``gm``, in place; returns how many rewrites applied."""
    return drop_noop_expands(gm) + merge_disjoint_cats(gm) + sizes_from_inputs(gm) + empty_batch_norm_statistics(gm)

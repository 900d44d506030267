"""The training graph's forward/backward split, with what the backward saves made cheap for ORT.

AOTAutograd traces one joint graph (forward and backward) and a partition function decides
which forward values the backward keeps ("saved tensors"). Every saved value is an output of a
forward ORT region, and ORT materializes each output in a buffer of its own, where eager's
saved views cost nothing. These patterns of the joint graph make that expensive:

- **a weight's transpose, transposed back**: ``linear`` uses ``t(weight)``; its gradient uses
  ``t(t(weight))``. The backward then saves ``t(weight)``: on ORT a transposed copy of every
  weight per step, and a ``Transpose`` ORT can no longer fold into its ``Gemm`` (the
  transposed value is an output).
- **detached copies of saved activations**: the ReLU gradient reads ``detach(detach(relu))``,
  so the backward saves both ``relu`` and ``detach(relu)``: two copies of the same values.
- **reshaped activations**: ``flatten(relu)`` before a linear layer is saved beside ``relu``.
- **clones**: dropout with ``p=0`` in training mode is ``clone``; the backward saved both the
  activation and its clone (a TransformerEncoderLayer's feed-forward: 8 MB copied per step).

:func:`simplify_joint` points the uses of detach chains, plain clones and of transposes that
cancel at their source (the values are the same: ``detach`` only stops gradients, which the
joint graph has already traced, and the graph's own values are never written).
:func:`views_to_backward` then gives the backward its own copy of every other chain of
element-preserving views it reads from the forward, so the backward saves the chain's base (a
weight is a forward input, handed over without ORT) and recomputes the views, which ORT folds
into their consumers. :func:`partition` runs both before torch's default partition. Graph
inputs the graph writes into (running statistics) are never made the source of a read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat
from ..partition import SHAPE_VIEWS

__all__ = ["simplify_joint", "views_to_backward", "partition", "written_placeholders"]

_DETACHES = {torch.ops.aten.detach.default, torch.ops.aten.alias.default}

#: views whose result has the elements of their input, each once (or, ``expand``, repeated):
#: saving the input instead of the view never saves more
_WHOLE_VIEWS = {
    *_DETACHES,
    *SHAPE_VIEWS,
    torch.ops.aten.t.default,
    torch.ops.aten.transpose.int,
    torch.ops.aten.permute.default,
    torch.ops.aten.expand.default,
}


def _permutation(node: torch.fx.Node) -> tuple[torch.fx.Node, list[int]] | None:
    """``(input, perm)`` when ``node`` only permutes its input's dims (t, transpose, permute)."""
    if node.op != "call_function" or not isinstance(node.args[0], torch.fx.Node):
        return None
    source = node.args[0]
    val = source.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    rank = val.dim()
    if rank == 0:
        return None
    if node.target is torch.ops.aten.t.default:
        return (source, [1, 0]) if rank == 2 else None
    if node.target is torch.ops.aten.transpose.int:
        perm = list(range(rank))
        a, b = (d % rank for d in node.args[1:3])
        perm[a], perm[b] = perm[b], perm[a]
        return source, perm
    if node.target is torch.ops.aten.permute.default:
        return source, [d % rank for d in node.args[1]]
    return None


def _plain_clone(node: torch.fx.Node) -> bool:
    """A ``clone`` that keeps its (contiguous) input's layout: the same values and strides."""
    if node.target is not torch.ops.aten.clone.default or not isinstance(node.args[0], torch.fx.Node):
        return False
    val = node.args[0].meta.get("val")
    layout = node.kwargs.get("memory_format")
    return (
        isinstance(val, torch.Tensor)
        and layout in (None, torch.contiguous_format, torch.preserve_format)
        and val.is_contiguous()
    )


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """The value ``node`` equals once detaches, plain clones of intermediates and permutations
    that cancel are skipped.

    A clone is skipped only on the way to a value the graph computes: a graph input may be
    written later (input mutations), while the graph's own values never are (functional).
    """
    current, perm = node, None  # perm: how the dims of `current` map to those of `node`
    best, cloned = node, False
    while current.op == "call_function":
        if current.target in _DETACHES and isinstance(current.args[0], torch.fx.Node):
            current = current.args[0]
        elif _plain_clone(current):
            current, cloned = current.args[0], True
        else:
            step = _permutation(current)
            if step is None:
                break
            current, inner = step
            # node's dim i is current-before-step's dim perm[i], which is current's inner[perm[i]]
            perm = inner if perm is None else [inner[p] for p in perm]
        if (perm is None or perm == sorted(perm)) and not (cloned and current.op == "placeholder"):
            best = current
    return best


def simplify_joint(gm: torch.fx.GraphModule) -> int:
    """Point the uses of detach chains, plain clones of computed values and cancelling
    transposes at their source, in place.

    Uses by the graph's output are left alone (AOTAutograd has recorded how the outputs alias),
    and so are reads whose source would be a graph input the graph writes into. Returns the
    number of uses rewritten.
    """
    written = written_placeholders(gm)

    def pointed(arg: Any) -> torch.fx.Node | None:
        """The source a direct argument should read instead, or None."""
        if isinstance(arg, torch.fx.Node) and arg.op == "call_function":
            source = _source(arg)
            if source is not arg and source not in written:
                return source
        return None

    rewritten = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for i, arg in enumerate(node.args):
            source = pointed(arg)
            if source is not None:
                node.update_arg(i, source)
                rewritten += 1
        for key, arg in list(node.kwargs.items()):
            source = pointed(arg)
            if source is not None:
                node.update_kwarg(key, source)
                rewritten += 1
    if rewritten:  # the chains left without users are dropped by the partition's own cleanup
        gm.recompile()
    return rewritten


def views_to_backward(gm: torch.fx.GraphModule) -> int:
    """Give the backward its own copy of each chain of whole views it reads from the forward.

    The copies open the backward (right after the last forward node, in forward order, so
    each follows what it reads), and the default partition puts them there and saves the
    chain's base instead of the view. In place; returns the number of views copied.
    """
    if any(n.meta.get("recompute") is not None for n in gm.graph.nodes):
        return 0  # activation checkpointing: the partition follows the user's policy
    forward = _compat.joint_forward_nodes(gm)
    start = next((n for n in gm.graph.nodes if n not in forward and n.op != "placeholder"), None)
    if start is None or start.op == "output":
        return 0  # no backward
    written = written_placeholders(gm)
    copies: dict[torch.fx.Node, torch.fx.Node] = {}

    def copy_chain(node: torch.fx.Node) -> torch.fx.Node:
        if node in copies:
            return copies[node]
        base = node.args[0]
        if isinstance(base, torch.fx.Node) and base in forward and _is_whole_view(base):
            base = copy_chain(base)
        with gm.graph.inserting_before(start):
            made = gm.graph.node_copy(node, lambda n: base if n is node.args[0] else n)
        made.meta.pop("partitioner_tag", None)  # a copy of a forward node, placed in the backward
        copies[node] = made
        return made

    for node in list(gm.graph.nodes):
        if node not in forward or not _is_whole_view(node):
            continue
        # (a copy never reads a forward view: its base is the base's copy, made first)
        users = [u for u in node.users if u not in forward and u.op != "output"]
        if not users or _chain_base(node) in written:
            continue  # a graph input written later: the backward keeps the forward's copy
        made = copy_chain(node)
        for user in users:
            user.replace_input_with(node, made)
    if copies:
        gm.recompile()
    return len(copies)


def _chain_base(node: torch.fx.Node) -> torch.fx.Node:
    """The first value below a chain of whole views."""
    while _is_whole_view(node):
        node = node.args[0]
    return node


def written_placeholders(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The graph inputs an op of ``gm`` writes into (input mutations, e.g. running statistics),
    directly or through views."""
    written = set()
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
            continue
        for arg, value in zip(target._schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node):
                written.add(_chain_base(value))
    return {n for n in written if n.op == "placeholder"}


def _is_whole_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in _WHOLE_VIEWS and isinstance(node.args[0], torch.fx.Node)


def partition(joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """AOTAutograd partition function: :func:`simplify_joint` and :func:`views_to_backward`,
    then torch's default partition."""
    simplify_joint(joint)
    views_to_backward(joint)
    return _compat.default_partition()(joint, joint_inputs, **kwargs)

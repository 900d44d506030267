"""Why an aten node of an FX graph cannot run on ORT, or None when it can.

:func:`static_reason` answers what needs no translation (the node's devices and dtypes, a
mutation, a distrusted translation, an op the options keep in PyTorch) and says
:data:`NEEDS_PROBE` where only translating the op can tell (:mod:`.probes`);
:func:`unsupported_reason` and :func:`graph_reasons` give the whole answer, for one node or for
many probed together. :func:`op_reason` asks the same of an op given by example values, for
front doors without an FX graph.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat
from ..options import Options
from ..reasons import Reason
from .probes import probe_op, probe_ops
from .rules import (
    _CARRIED,
    _DEVICES,
    _meta,
    bound_arguments,
    distrust_reason,
    excluded_reason,
    registered_ops,
)

__all__ = ["NEEDS_PROBE", "static_reason", "unsupported_reason", "graph_reasons", "op_reason"]


# Ops that only shuffle metadata or are pure Python plumbing, always kept with their producer.
_GETITEM = operator.getitem


def _tensor_metas(values: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in torch.fx.node.map_aggregate(values, _meta) if values is not None else ():
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


def _flat_metas(value: Any) -> list[Any]:
    flat: list[Any] = []
    torch.fx.node.map_aggregate(value, lambda v: flat.append(v))
    return flat


#: what :func:`static_reason` returns when only translating the op can tell
NEEDS_PROBE = "needs a translation probe"


def static_reason(node: torch.fx.Node, options: Options) -> str | None:
    """The reason ``node`` cannot run on ORT that needs no translation, None when it can
    (getitem), or :data:`NEEDS_PROBE` when the answer depends on the op's ONNX translation."""
    if node.op != "call_function":
        return Reason.NO_MAPPING
    target = node.target
    if target is _GETITEM:
        return None
    if not isinstance(target, torch._ops.OpOverload):
        return Reason.NO_MAPPING
    excluded = excluded_reason(target, options, node)
    if excluded is not None:
        return excluded
    out_meta = _meta(node)
    outs = _flat_metas(out_meta)
    if any(isinstance(o, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) for o in outs):
        return Reason.SYMBOLIC
    in_metas = [m for m in _flat_metas(torch.fx.node.map_aggregate(node.args, _meta))]
    in_metas += _flat_metas(torch.fx.node.map_aggregate(node.kwargs, _meta))
    tensors = [t for t in in_metas + outs if isinstance(t, torch.Tensor)]
    # first: whatever else is true of the op, ORT cannot read these tensors (a factory op's
    # device argument shows in its output)
    if any(t.device.type not in _DEVICES for t in tensors) or any(
        isinstance(v, torch.device) and v.type not in _DEVICES for v in in_metas
    ):
        return Reason.UNSUPPORTED_DEVICE
    if target._schema.is_mutable:
        return Reason.MUTATION
    distrusted = distrust_reason(
        target,
        lambda: {k: torch.fx.node.map_aggregate(v, _meta) for k, v in bound_arguments(target, node.args, node.kwargs).items()},
    )
    if distrusted is not None:
        return distrusted
    if target not in registered_ops(options.cache_dir):
        return Reason.NO_MAPPING
    if any(t.dtype not in _CARRIED for t in tensors):
        return Reason.UNSUPPORTED_DTYPE
    return NEEDS_PROBE


def unsupported_reason(node: torch.fx.Node, options: Options, providers: Sequence[str]) -> str | None:
    """None when ``node`` can run on ORT with ``providers``, else the reason it cannot."""
    reason = static_reason(node, options)
    if reason is NEEDS_PROBE:
        return probe_op(node, tuple(providers), options.cache_dir)
    return reason


def graph_reasons(nodes: Sequence[torch.fx.Node], options: Options, providers: Sequence[str]) -> dict[torch.fx.Node, str | None]:
    """:func:`unsupported_reason` for many nodes; the ops that need a probe are probed together."""
    reasons: dict[torch.fx.Node, str | None] = {}
    pending = []
    for node in nodes:
        reason = static_reason(node, options)
        if reason is NEEDS_PROBE:
            pending.append(node)
        else:
            reasons[node] = reason
    reasons.update(probe_ops(pending, tuple(providers), options.cache_dir))
    return reasons


def op_reason(
    target: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    output: Any,
    options: Options,
    providers: Sequence[str],
) -> str | None:
    """Like :func:`unsupported_reason` for an op given by its overload and example values.

    ``args``/``kwargs``/``output`` hold tensors (meta or fake tensors are fine: only dtype,
    rank and device are read) and Python constants. Front doors without an FX graph (the
    TorchScript bridge) use this, so every front door answers from the same table.
    """
    graph = torch.fx.Graph()
    counter = [0]
    mode = _compat.new_fake_mode()

    def fake(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        device = "cpu" if value.device.type == "meta" else value.device
        with mode:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)

    def to_node(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            ph = graph.placeholder(f"in_{counter[0]}")
            counter[0] += 1
            ph.meta["val"] = fake(value)
            return ph
        return value

    node_args = torch.fx.node.map_aggregate(tuple(args), to_node)
    node_kwargs = torch.fx.node.map_aggregate(dict(kwargs or {}), to_node)
    node = graph.call_function(target, node_args, node_kwargs)  # type: ignore[arg-type]
    node.meta["val"] = torch.fx.node.map_aggregate(output, fake)
    return unsupported_reason(node, options, providers)

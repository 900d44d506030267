"""Split an aten FX graph into ORT regions and PyTorch code: reasons -> partitions -> regions.

Every node gets a reason it cannot run on ORT, or None (:mod:`ort_lazy.support`); supported
nodes are grouped with torch's ``CapabilityBasedPartitioner``; each group is exported to one ONNX
model and becomes an :class:`~ort_lazy.runtime.region.OrtRegion`. A region whose export or
session creation fails stays in PyTorch, counted and warned about once.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _compat, metrics
from ._compat import size_hint
from .debug.records import GraphRecord, mark, new_record
from .export.cache import cached_export, export_for, graph_device
from .opnames import op_name
from .options import Options
from .reasons import Reason
from .runtime.flavour import provider_problem
from .runtime.providers import kernel_providers, traits_of
from .runtime.region import (
    OrtRegion,
    compute_ops,
    dense_order,
    dump,
    in_layout,
    open_runner,
    report_fallback,
    traced_order,
)
from .support import graph_reasons, mark_runtime_weights, probe_error, save_support_table

__all__ = ["compile_graph", "SHAPE_VIEWS", "VIEW_OUTSIDE_BYTES"]

_aten = torch.ops.aten

#: views that only reshape: a contiguous tensor stays contiguous, and PyTorch makes them free
SHAPE_VIEWS = frozenset(
    {
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.reshape.default,
        _aten.squeeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.unsqueeze.default,
        _aten.alias.default,
    }
)

#: a region value read after the region through a shape view of at least this many bytes is
#: returned as it is and viewed by PyTorch (:func:`_views_outside`). Below it, ORT's copy (of a
#: value still in cache) costs no more than PyTorch's call of the view op: a 75 us compiled call
#: returning a view of 64 KiB took 3% longer viewed by PyTorch, of 256 KiB the same, of 1 MiB 1%
#: less (and no second copy of the value is held)
VIEW_OUTSIDE_BYTES = 1 << 18


class _Support(OperatorSupportBase):
    def __init__(self, reasons: dict[torch.fx.Node, str | None]) -> None:
        self.reasons = reasons

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return self.reasons.get(node, Reason.NO_MAPPING) is None


def _compute_nodes(nodes: Sequence[torch.fx.Node]) -> int:
    return sum(1 for n in nodes if n.op == "call_function" and n.target is not operator.getitem)


def _node_reasons(gm: torch.fx.GraphModule, options: Options, providers: Sequence[str]) -> dict[torch.fx.Node, str | None]:
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    reasons = graph_reasons([n for n in calls if n.target is not operator.getitem], options, providers)
    for node in calls:
        if node.target is operator.getitem:
            src = node.args[0]
            reasons[node] = reasons.get(src, Reason.NO_MAPPING) if isinstance(src, torch.fx.Node) else Reason.NO_MAPPING
    for node in _returned_input_views(gm):
        reasons[node] = Reason.RETURNED_VIEW
    return {n: reasons[n] for n in calls}


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride(), value.storage_offset()))
    return False


def _returned_input_views(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The view ops leading from a graph input to a graph output, where any has symbolic sizes.

    AOTAutograd rebuilds an output that is a view of an input from the input itself. With
    symbolic sizes it cannot replay the recorded views, and falls back to ``as_strided`` with
    the strides of the tensor the graph returned: an ORT output is contiguous where the view
    was not (a column slice, a transpose, an expand), so the rebuilt output read the wrong
    elements or out of bounds. Made in PyTorch, the output is the view itself.
    """
    found: set[torch.fx.Node] = set()
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    for end in output.all_input_nodes:
        chain = []
        node = end
        while node.op == "call_function" and (
            node.target is operator.getitem or (isinstance(node.target, torch._ops.OpOverload) and node.target.is_view)
        ):
            chain.append(node)
            if not node.args or not isinstance(node.args[0], torch.fx.Node):
                break
            node = node.args[0]
        if node.op != "placeholder" or not chain:
            continue
        if any(
            _symbolic(n.meta.get("val")) or any(_symbolic(a.meta.get("val")) for a in n.all_input_nodes) for n in chain
        ):
            found.update(chain)
    return found


def _movable_view(node: torch.fx.Node, region: dict[torch.fx.Node, Any]) -> bool:
    """A shape view of at least :data:`VIEW_OUTSIDE_BYTES` in ``region`` whose sizes, when the
    graph computes them (symbolic shapes), come from outside the region (see
    :func:`_views_outside`)."""
    if node.op != "call_function" or node.target not in SHAPE_VIEWS:
        return False
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    sizes = [n for n in node.all_input_nodes if n is not node.args[0]]
    if any(n in region or not isinstance(n.meta.get("val"), (int, torch.SymInt)) for n in sizes):
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    numel = size_hint(val.numel())
    return numel is not None and numel * val.element_size() >= VIEW_OUTSIDE_BYTES


def _views_outside(gm: torch.fx.GraphModule, partitions: Sequence[Any], reasons: dict[torch.fx.Node, str | None]) -> None:
    """Make the large shape views a region would return in PyTorch, after the region.

    ORT writes every region output into a tensor of its own, so a ``Reshape``, ``Squeeze`` or
    ``Unsqueeze`` that a region returns is a copy of the value it views (a TransformerEncoderLayer
    training step copied 11.6 MB per step this way). Instead, the readers after the region
    get the same view made by PyTorch, which costs no copy, from the value the region already holds
    (now returned in its place) or from the region's own input; a view also read inside the region
    stays there for those readers; symbolic sizes are read from the graph outside the region, as
    the view read them. The views keep eager's aliasing: in eager they alias their base too.
    """
    for partition in partitions:
        nodes = partition.nodes
        outside: dict[torch.fx.Node, torch.fx.Node] = {}
        changed = True
        while changed:  # a view of a view: the inner one is read outside once the outer one is
            changed = False
            for view in list(nodes):
                readers = [u for u in view.users if u not in nodes]
                if not readers or not _movable_view(view, nodes):
                    continue
                twin = outside.get(view)
                if twin is None:
                    with gm.graph.inserting_after(view):
                        twin = gm.graph.call_function(view.target, view.args, dict(view.kwargs))
                    twin.meta = dict(view.meta)
                    reasons[twin] = Reason.VIEW_OUTSIDE
                    outside[view] = twin
                for reader in readers:
                    reader.replace_input_with(view, twin)
                if not view.users:
                    partition.remove_node(view)
                    reasons.pop(view, None)
                    gm.graph.erase_node(view)
                changed = True


def _record(reasons: dict[torch.fx.Node, str | None]) -> None:
    for node, reason in reasons.items():
        # Python-level ops and shape arithmetic (SymInt) are plumbing, not compute left behind.
        if reason is not None and reason != Reason.SYMBOLIC and isinstance(node.target, torch._ops.OpOverload):
            metrics.record_fallback(op_name(node.target), reason)
            detail = probe_error(node.target) if reason == Reason.EXPORT_FAILED else None
            metrics.warn_once(
                f"fallback:{op_name(node.target)}:{reason}",
                "ort-lazy: %s runs in PyTorch (%s)",
                op_name(node.target),
                f"{reason}: {detail}" if detail else reason,
                # a default choice, not a limitation: said at info level
                level=logging.INFO if reason in (Reason.PREFERRED, Reason.RETURNED_VIEW) else logging.WARNING,
            )


def _copy_placeholder_meta(parent: torch.fx.GraphModule, name: str) -> torch.fx.GraphModule:
    """Fused submodules' placeholders lack meta['val']: copy it from the parent's arguments."""
    sub = getattr(parent, name)
    call = next(n for n in parent.graph.nodes if n.op == "call_module" and n.target == name)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, arg in zip(placeholders, call.args):
        if isinstance(arg, torch.fx.Node):
            ph.meta["val"] = arg.meta.get("val", arg.meta.get("example_value"))
    return sub


def _tuple_output(gm: torch.fx.GraphModule) -> bool:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return isinstance(out.args[0], (tuple, list))


def _make_region(
    name: str,
    sub: torch.fx.GraphModule,
    options: Options,
    spinning: bool,
    constants: dict[int, torch.Tensor],
    weights: str,
    training: bool = False,
) -> tuple[OrtRegion | None, str | None]:
    """Export ``sub`` and open its ORT session: the region, or None (counted, warned once) and
    the error (an execution provider's own words included) when either fails.
    ``training``: a region of a training graph (forward or backward)."""
    ops = compute_ops(sub)
    shared = weights == "shared"
    try:
        model = cached_export(sub, name, options, constants, shared=shared)
    except Exception as e:  # any export fault falls back: never crash the user's model
        report_fallback(name, ops, "export_failures", Reason.EXPORT_FAILED, e, "export failed for")
        return None, f"export failed: {e}"
    dump(options, name, sub, model)
    try:
        runner = open_runner(model, options, graph_device(sub), spinning=spinning, weights=constants, training=training)
    except Exception as e:  # session creation faults (bad model, missing kernel, provider) fall back
        report_fallback(name, ops, "ort_failures", Reason.ORT_FAILED, e, "ORT cannot run")
        return None, f"ORT cannot run it: {e}"
    metrics.increment("regions_on_ort")

    def export(graph: torch.fx.GraphModule, export_name: str, checked: bool = True) -> Any:
        return export_for(graph, export_name, options, constants or None, shared, graph_device(sub), checked)

    region = OrtRegion(
        name, sub, runner, options, _tuple_output(sub), constants=constants, weights=weights, export=export, training=training
    )
    return region, None


def training_options(options: Options, device: torch.device) -> Options:
    """``options`` for a training graph: providers that run inference graphs only (OpenVINO,
    CoreML, QNN ...: their readers refuse training forms such as LayerNormalization's saved
    statistics) leave training graphs to ORT's kernel providers of the list (the CPU provider),
    said once."""
    providers = options.resolve_providers(device)
    inference_only = [p for p in providers if traits_of(p).inference_only]
    if not inference_only:
        return options
    kept = tuple(kernel_providers(providers))
    if kept == tuple(providers):
        return options
    metrics.warn_once(
        f"training-providers:{providers}",
        "ort-lazy: %s run(s) inference graphs only; training graphs run on %s",
        ", ".join(inference_only),
        ", ".join(kept),
    )
    return options.replace(providers=kept)


def compile_graph(
    gm: torch.fx.GraphModule,
    options: Options,
    *,
    tag: str = "graph",
    constants: dict[int, torch.Tensor] | None = None,
    weights: str = "snapshot",
) -> torch.fx.GraphModule:
    """Replace every supported region of ``gm`` (aten ops, ``meta['val']`` set) by an ORT region.

    ``constants`` maps placeholder positions of ``gm`` to parameters that regions bind as ORT
    initializers instead of taking as inputs, as ``weights`` says (:data:`~ort_lazy.specs.WEIGHT_MODES`).

    Returns the same GraphModule object, modified, or ``gm`` untouched when nothing runs on ORT.
    """
    start = time.perf_counter()
    metrics.increment("graphs_compiled")
    if tag.startswith(("forward", "backward")):
        options = training_options(options, graph_device(gm))
    providers = options.resolve_providers(graph_device(gm))
    problem = provider_problem(providers)
    if problem is not None:  # inferred from the tensors' device (explicit ones are checked earlier)
        metrics.warn_once(f"providers:{providers}", "ort-lazy: %s; graphs on that device run in PyTorch", problem)
    mark_runtime_weights(gm, constants)
    reasons = _node_reasons(gm, options, providers)
    _record(reasons)
    record = new_record(tag)
    for node, reason in reasons.items():
        if isinstance(node.target, torch._ops.OpOverload) and reason != Reason.SYMBOLIC:
            record.ops.append((op_name(node.target), reason))

    partitioner = CapabilityBasedPartitioner(gm, _Support(reasons), allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    _views_outside(gm, proposed, reasons)
    kept = []
    too_small = 0  # compute ops of the largest region min_block_size kept off ORT
    for p in proposed:
        nodes = list(p.nodes)
        if not nodes:
            continue
        if _compute_nodes(nodes) < options.min_block_size:
            too_small = max(too_small, _compute_nodes(nodes))
            for n in nodes:
                if n.target is not operator.getitem:
                    metrics.record_fallback(op_name(n.target), Reason.SMALL_REGION)
                    mark(record, op_name(n.target), Reason.SMALL_REGION)
            continue
        kept.append(p)
    if not kept:
        if too_small:
            metrics.warn_once(
                f"min_block_size:{options.min_block_size}",
                "ort-lazy: min_block_size=%d leaves nothing of the %s graph on ORT (its largest region ORT "
                "could run has %d compute op(s)); lower min_block_size / ORT_LAZY_MIN_BLOCK_SIZE",
                options.min_block_size,
                tag,
                too_small,
            )
        record.steps = _steps(gm, reasons, {}, tag)
        save_support_table(options.cache_dir)
        _finish(record, start)
        return gm

    # ORT's threads spin within a run and park when it ends (force_spinning_stop), so PyTorch
    # work between runs is not starved; measured faster than never spinning, alone or mixed
    spinning = options.allow_spinning if options.allow_spinning is not None else True
    frozen: dict[str, torch.Tensor] = {}  # by placeholder name (fusing may copy the nodes)
    if constants:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        frozen = {placeholders[i].name: t for i, t in constants.items() if i < len(placeholders)}
    fused = partitioner.fuse_partitions(kept)
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        name = node.target
        sub = _copy_placeholder_meta(fused, name)
        metrics.increment("regions_compiled")
        sub_constants = {
            j: frozen[a.name]
            for j, a in enumerate(node.args)
            if isinstance(a, torch.fx.Node) and a.op == "placeholder" and a.name in frozen
        }
        region, error = _make_region(
            f"{tag}_{name}", sub, options, spinning, sub_constants, weights, tag.startswith(("forward", "backward"))
        )
        if region is not None and sub_constants:
            node.args = tuple(a for j, a in enumerate(node.args) if j not in sub_constants)
        ops = compute_ops(sub)
        entry: dict[str, Any] = {"name": f"{tag}_{name}", "ops": ops, "on_ort": region is not None}
        placed = region.runner.ep_nodes if region is not None and region.runner is not None else None
        if placed:
            entry["ep_nodes"] = dict(placed)
        if error:
            entry["error"] = error[:600]
        record.regions.append(entry)
        if region is not None:
            region.report = entry
            region.record = record
            setattr(fused, name, region)
            # call the region's forward directly: skips nn.Module.__call__ (hooks) per call
            node.op, node.target = "call_function", region.forward
        else:
            for op in ops:
                mark(record, op, Reason.EXPORT_FAILED + " / " + Reason.ORT_FAILED)
    _keep_traced_layouts(fused, tag)
    fused.recompile()
    record.steps = _steps(fused, reasons, {r["name"]: r for r in record.regions}, tag)
    save_support_table(options.cache_dir)
    _finish(record, start)
    return fused


def _region_of(node: torch.fx.Node) -> OrtRegion | None:
    region = getattr(node.target, "__self__", None) if node.op == "call_function" else None
    return region if isinstance(region, OrtRegion) else None


def _region_value(node: torch.fx.Node) -> tuple[bool, Any]:
    """(True, the value its graph was traced with) when ``node`` is a region's call or one of
    its outputs (the value: None for the call of a region returning a tuple); (False, None)
    for other nodes."""
    index = None
    region = _region_of(node)
    if region is None and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        region, index = _region_of(node.args[0]), node.args[1]
    if region is None:
        return False, None
    returned = next(n for n in reversed(region.torch_module.graph.nodes) if n.op == "output").args[0]
    if region.tuple_output:
        returned = returned[index] if isinstance(index, int) else None
    return True, returned.meta.get("val") if isinstance(returned, torch.fx.Node) else None


#: ops whose result depends on their input's strides, not only its values: ``view`` raises
#: where the strides do not allow it, ``_reshape_alias`` and ``as_strided`` address memory
_STRIDE_READERS = frozenset(
    {
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.view.dtype,
        _aten.view_as_complex.default,
        _aten._reshape_alias.default,
        _aten.as_strided.default,
    }
)


def _keep_traced_layouts(gm: torch.fx.GraphModule, tag: str) -> int:
    """Make the PyTorch ops of ``gm`` that read strides (:data:`_STRIDE_READERS`), and its
    caller, get values in the memory layout the graph was traced with.

    ORT returns every output contiguous where PyTorch's op made it channels-last or permuted
    (a ``permute`` back after a channels-last layer norm), and a saved tensor reaches the
    backward graph in the layout the forward region gave it. Values are the same, and so are
    those of the PyTorch ops after them, whose layouts follow their inputs'; but a ``view``
    after a ``permute`` of such a tensor raised where eager's succeeded. Each value that may be
    laid out otherwise than traced (such an output or placeholder, and what PyTorch ops make of
    it) goes through :func:`~ort_lazy.runtime.region.in_layout` before a stride reader reads
    it: a check per call, a copy only when the layout differs. So do the values the graph
    returns to the user (a channels-last model's output is channels-last, as eager's and
    Inductor's are); not the tensors a forward graph saves for its backward one, nor a
    backward graph's gradients (autograd lays those out as their parameters). Returns the
    number of values so laid out.
    """
    traced: dict[torch.fx.Node, Any] = {}  # a region output's value when traced
    moved: set[torch.fx.Node] = set()  # values whose layout may differ from the traced one

    def lay_out(value: torch.fx.Node, before: torch.fx.Node, made: dict[torch.fx.Node, torch.fx.Node]) -> torch.fx.Node:
        """``value`` in its traced layout (a node made once, before ``before``), or itself
        when that layout is not dense or symbolic."""
        order = dense_order(traced.get(value, value.meta.get("val")))
        if order is None:
            return value
        if value not in made:
            with gm.graph.inserting_before(before):
                made[value] = gm.graph.call_function(in_layout, (value, order))
        return made[value]

    laid_out: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op == "placeholder":
            if traced_order(node.meta.get("val")) is not None:
                moved.add(node)
            continue
        if node.op != "call_function" or node.target is in_layout:
            continue
        is_region_value, val = _region_value(node)
        if is_region_value:
            traced[node] = val
            if traced_order(val) is not None:
                moved.add(node)
            continue
        inputs = [v for v in node.all_input_nodes if v in moved]
        if not inputs:
            continue
        if node.target not in _STRIDE_READERS:
            moved.add(node)  # its layout follows its inputs'
            continue
        for value in inputs:
            node.replace_input_with(value, lay_out(value, node, laid_out))
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = output.args[0]
    if not isinstance(returned, (tuple, list)):
        return len(laid_out)
    shown = _compat.returned_in_traced_layout(output) or [not tag.startswith("backward")] * len(returned)
    # a value a stride reader already reads laid out is returned through the same node
    values = [
        lay_out(v, output, laid_out) if shown[i] and isinstance(v, torch.fx.Node) and v in moved else v
        for i, v in enumerate(returned)
    ]
    if any(a is not b for a, b in zip(values, returned)):
        output.args = (type(returned)(values),) + tuple(output.args[1:])
    return len(laid_out)


def _steps(
    gm: torch.fx.GraphModule, reasons: dict[torch.fx.Node, str | None], regions: dict[str, dict[str, Any]], tag: str
) -> list[dict[str, Any]]:
    """What runs, in execution order (for explain): the entries of ``regions`` (by region name)
    and ``{"pytorch": [(op, reason), ...]}`` for the ops between them."""
    steps: list[dict[str, Any]] = []
    for node in gm.graph.nodes:
        entry = None
        if node.op == "call_module":
            entry = regions.get(f"{tag}_{node.target}")
        elif node.op == "call_function" and isinstance(getattr(node.target, "__self__", None), OrtRegion):
            entry = node.target.__self__.report
        if entry is not None:
            steps.append(entry)
            continue
        if node.op != "call_function":
            continue
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            op, reason = f"higher_order.{node.target.name()}", Reason.HIGHER_ORDER
        elif isinstance(node.target, torch._ops.OpOverload):
            op, reason = op_name(node.target), reasons.get(node, Reason.NO_MAPPING)
            if reason in (Reason.SYMBOLIC, Reason.VIEW_OUTSIDE):
                continue
            if reason is None:  # supported, but in a region min_block_size kept off ORT
                reason = Reason.SMALL_REGION
        else:
            continue
        if not steps or "pytorch" not in steps[-1]:
            steps.append({"pytorch": []})
        steps[-1]["pytorch"].append((op, reason))
    return steps


def _finish(record: GraphRecord, start: float) -> None:
    seconds = time.perf_counter() - start
    metrics.record_time("compile", seconds)
    metrics.append_compile_record(
        {
            "graph": record.tag,
            "compile_ms": seconds * 1e3,
            "ops": len(record.ops),
            "ops_on_ort": sum(1 for _, r in record.ops if r is None),
            "regions": record.regions,
            "fallbacks": [{"op": op, "reason": r} for op, r in record.ops if r is not None],
        }
    )

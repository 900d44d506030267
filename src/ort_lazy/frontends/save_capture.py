"""Capture and lowering for saving: the model exported with ``torch.export.export`` (eval mode, no
grad) and decomposed with ort-lazy's table (:func:`capture`), then lowered and partitioned as
the dynamo door does and rewritten for a program (:func:`lower`): each ORT region a call of the
``ort_lazy::region`` op, regions ORT could not take inlined back as aten ops, the weights only
regions read taken out, and the direct plan of a model that is one region.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind
from torch.utils import _pytree as pytree

from .._compat import size_hint
from ..lowering.aten import lower_exported, weight_mode
from ..lowering.decompositions import decomposition_table
from ..opnames import op_name
from ..options import Options
from ..runtime.artifact_regions import REGION_OP
from ..runtime.region import OrtRegion, in_layout, learn_facts
from ..specs import dim_symbols, parse_dim

__all__ = ["SaveError", "Lowered", "capture", "lower", "PY_FUNCTIONS"]

_aten = torch.ops.aten
_CPU = torch.device("cpu")


class SaveError(RuntimeError):
    """The model cannot be saved as asked (the message says what stays in PyTorch, or why)."""


@dataclasses.dataclass
class _Region:
    """A region of the lowered program, as the artifact keeps it."""

    id: str
    region: OrtRegion
    model: Any  # OrtModel: the exact forms (no check outputs)
    arrangement: list[tuple[str, int]]
    size_symbols: list[str | None]
    initializers: list[dict[str, Any]]


@dataclasses.dataclass
class Lowered:
    """A model captured and lowered for saving: the program with ``ort_lazy::region`` calls,
    its regions, the weights only regions read (by program name), what stays in PyTorch, and
    the direct plan when the whole model is one region."""

    program: ExportedProgram
    regions: list[_Region]
    weights: dict[str, torch.Tensor]
    pytorch_ops: list[str]
    direct: dict[str, Any] | None
    user_inputs: list[torch.fx.Node]
    options: Options


# -- capture ------------------------------------------------------------------------------------


def _split_inputs(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword example inputs: a tuple/list (positional), a mapping (keywords),
    or one value (a single positional input)."""
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def _plain(value: Any) -> Any:
    """``value`` with its containers made Python's own: mappings (a Hugging Face
    ``ModelOutput``) dicts, dataclasses dicts of their fields, named tuples tuples, so a loaded
    model's outputs need no class of the model's library."""
    if isinstance(value, (torch.Tensor, int, float, bool, str, type(None))):
        return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _plain_spec(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """The structure of ``spec`` with :func:`_plain` containers (the same leaves, in order)."""
    leaves = list(range(spec.num_leaves))
    plain = _plain(pytree.tree_unflatten(leaves, spec))
    flat, out = pytree.tree_flatten(plain)
    if flat != leaves:
        raise SaveError(f"the model's outputs {spec} cannot be kept as plain containers")
    return out


def capture(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any, options: Options
) -> ExportedProgram:
    """``torch.export.export`` of ``model`` in eval mode without grad (its mode restored),
    decomposed with ort-lazy's table."""
    if not isinstance(model, torch.nn.Module):
        raise SaveError(f"expected a torch.nn.Module, got {type(model).__name__}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(model, args, kwargs or None, dynamic_shapes=dynamic_shapes)
    finally:
        model.train(was_training)
    program = program.run_decompositions(decomposition_table(options.cache_dir, options.torch_ops))
    # export's checks that a value has the dtype and device it was traced with (``.to()``):
    # no value, nothing to compute, and each would keep its tensor and a region boundary in
    # PyTorch (dynamo's graphs have none; the loaded model checks its inputs itself)
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is _aten._assert_tensor_metadata.default:
            graph.erase_node(node)
    program.graph_module.recompile()
    return program


# -- lowering -------------------------------------------------------------------------------------

_STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
#: ops that read sizes, not compute: not counted as ops left in PyTorch
_SIZE_OPS = frozenset({_aten.sym_size.int, _aten.sym_numel.default, _aten.sym_stride.int, _aten.sym_storage_offset.default})


def _state_tensor(program: ExportedProgram, target: str) -> torch.Tensor | None:
    value = program.state_dict.get(target)
    if value is None:
        value = program.constants.get(target)
    return value if isinstance(value, torch.Tensor) else None


def lower(program: ExportedProgram, options: Options) -> Lowered:
    """Lower ``program`` (from :func:`capture`) and rewrite it for saving: ORT regions as
    ``ort_lazy::region`` calls, regions ORT could not take inlined back as aten ops."""
    gm = program.graph_module
    signature = program.graph_signature
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mutated = set(signature.buffers_to_mutate.values())
    state: dict[int, torch.Tensor] = {}
    targets: dict[int, str] = {}  # id(tensor) -> the program's name for it
    for i, spec in enumerate(signature.input_specs[: len(placeholders)]):
        if spec.kind in _STATE_KINDS and spec.target is not None and spec.target not in mutated:
            tensor = _state_tensor(program, spec.target)
            if tensor is not None and tensor.device.type == "cpu":
                state[i] = tensor
                targets.setdefault(id(tensor), spec.target)
    mode = weight_mode(options, "cpu", sum(t.nbytes for t in state.values()))
    lowered = lower_exported(gm, options, state, mode)
    if lowered is gm:  # nothing on ORT: the program as it is, no regions
        lowered = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    graph = lowered.graph
    _restore_placeholder_names(graph, [n.name for n in placeholders])
    _inline_fallen_back(lowered)
    regions: list[_Region] = []
    for node in list(graph.nodes):
        region = getattr(node.target, "__self__", None) if node.op == "call_function" else None
        if isinstance(region, OrtRegion):
            regions.append(_as_region_call(lowered, node, region, f"r{len(regions)}", targets))
        elif node.op == "call_function" and node.target is in_layout:
            _as_aten_layout(graph, node)
    for name, child in list(lowered.named_children()):
        if isinstance(child, OrtRegion):
            delattr(lowered, name)
    graph.eliminate_dead_code()
    _check_serializable(graph)
    # weights: those regions bind and no PyTorch op reads leave the program (weights.bin)
    bound = {init["weight"] for r in regions for init in r.initializers}
    weights: dict[str, torch.Tensor] = {}
    kept_inputs = []
    for node, spec in zip([n for n in graph.nodes if n.op == "placeholder"], signature.input_specs):
        if spec.kind in _STATE_KINDS:
            if node.users or spec.target in bound:
                weights[spec.target] = _state_tensor(program, spec.target)  # type: ignore[assignment]
            if not node.users:
                graph.erase_node(node)
                continue
        elif spec.kind != InputKind.USER_INPUT:
            raise SaveError(f"the program takes a {spec.kind.name.lower()} input ({spec.arg}), which a saved model cannot hold")
        kept_inputs.append(spec)
    if any(s.kind != OutputKind.USER_OUTPUT for s in signature.output_specs):
        written = [s.target for s in signature.output_specs if s.kind != OutputKind.USER_OUTPUT]
        raise SaveError(f"the model writes into its state in inference ({written[:4]}); a saved model cannot hold that")
    lowered.recompile()
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = list(output.args[0])
    output_specs = [_renamed(spec, value) for spec, value in zip(signature.output_specs, returned)]
    entries = copy.deepcopy(program.module_call_graph)
    root = entries[0].signature
    if root is not None:
        user = [v for v, s in zip(returned, output_specs) if s.kind == OutputKind.USER_OUTPUT]
        root.outputs = [_renamed_arg(a, v) for a, v in zip(root.outputs, user)]
        root.out_spec = _plain_spec(root.out_spec)
    kept_names = {s.target for s in kept_inputs if s.target is not None}
    saved = ExportedProgram(
        root=lowered,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs=kept_inputs, output_specs=output_specs),
        state_dict={k: v for k, v in program.state_dict.items() if k in kept_names},
        range_constraints=program.range_constraints,
        module_call_graph=entries,
        example_inputs=program.example_inputs,
        constants={k: v for k, v in program.constants.items() if k in kept_names},
    )
    user_inputs = [n for n, s in zip(saved.graph.nodes, kept_inputs) if s.kind == InputKind.USER_INPUT]
    pytorch_ops = sorted(
        {
            op_name(n.target)
            for n in saved.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target is not REGION_OP
            and n.target not in _SIZE_OPS
        }
    )
    return Lowered(saved, regions, weights, pytorch_ops, _direct_plan(saved, kept_inputs), user_inputs, options)


def _restore_placeholder_names(graph: torch.fx.Graph, names: Sequence[str]) -> None:
    """Give ``graph``'s placeholders the program's names back: a copy of a graph renames a
    placeholder that shadows a builtin (``nn.Sequential``'s ``input`` becomes ``input_1``),
    and the program's signature, the inputs' names and the ONNX file's keep the model's own.
    Set as ``torch.export`` names them (the name alone: the generated code still picks names
    of its own, and the graph's namespace keeps the copy's name taken)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(names):
        raise SaveError(f"the lowered graph takes {len(placeholders)} inputs, the program {len(names)}")
    for node, name in zip(placeholders, names):
        if node.name != name:
            node.name = name


def _renamed(spec: Any, value: Any) -> Any:
    return dataclasses.replace(spec, arg=_renamed_arg(spec.arg, value))


def _renamed_arg(arg: Any, value: Any) -> Any:
    if isinstance(value, torch.fx.Node) and hasattr(arg, "name"):
        return dataclasses.replace(arg, name=value.name)
    return arg


def _inline_fallen_back(gm: torch.fx.GraphModule) -> None:
    """Put the ops of every region ORT could not take (left as a call of its fused submodule)
    back into ``gm``, so the program holds only ops."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        sub = gm.get_submodule(node.target)
        if not isinstance(sub, torch.fx.GraphModule):
            raise SaveError(f"the lowered graph calls module {node.target} ({type(sub).__name__}), which a program cannot hold")
        env: dict[torch.fx.Node, Any] = {}
        args = iter(node.args)
        result: Any = None
        with graph.inserting_before(node):
            for inner in sub.graph.nodes:
                if inner.op == "placeholder":
                    env[inner] = next(args)
                elif inner.op == "output":
                    result = torch.fx.map_arg(inner.args[0], env.__getitem__)
                else:
                    env[inner] = graph.node_copy(inner, env.__getitem__)
        if isinstance(result, torch.fx.Node):
            node.replace_all_uses_with(result)
        else:
            for user in list(node.users):
                if user.target is operator.getitem:
                    user.replace_all_uses_with(result[user.args[1]])
                    graph.erase_node(user)
        graph.erase_node(node)
        delattr(gm, node.target)


def _as_region_call(gm: torch.fx.GraphModule, node: torch.fx.Node, region: OrtRegion, rid: str, targets: dict[int, str]) -> _Region:
    """Replace the call of ``region`` by a call of the region op; the region's record."""
    graph = gm.graph
    model = region.runner.model if region.runner is not None else None
    if model is None:
        raise SaveError(f"{region.name} has no ORT model")
    if model.checks:
        # checked forms fall back to PyTorch on some inputs; a saved region has no PyTorch twin
        if region._export is None:
            raise SaveError(f"{region.name}: its model has check outputs and no exact form")
        model = region._export(region.torch_module, region.name, False)
    learn_facts(model, _CPU)
    example_sizes = [
        [size_hint(d) for d in val.shape] if isinstance(val, torch.Tensor) else []
        for val in (a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args)
    ]
    _work_at_example(model, example_sizes)
    tensors: list[torch.fx.Node] = []
    sizes: list[Any] = []
    arrangement: list[tuple[str, int]] = []
    size_symbols: list[str | None] = []
    for arg in node.args:
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        if isinstance(val, torch.Tensor):
            arrangement.append(("t", len(tensors)))
            tensors.append(arg)
        elif isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
            arrangement.append(("s", len(sizes)))
            sizes.append(arg)
            size_symbols.append(str(val.node.expr) if isinstance(val, torch.SymInt) else None)
        else:
            raise SaveError(f"{region.name} takes an input of type {type(val).__name__}, which the region op cannot carry")
    if len(arrangement) != len(model.input_specs):
        raise SaveError(f"{region.name}: {len(arrangement)} arguments for a model of {len(model.input_specs)} inputs")
    initializers = []
    for name, position in sorted(model.external.items()):
        tensor = region.constants.get(position)
        target = targets.get(id(tensor)) if tensor is not None else None
        if target is None:
            raise SaveError(f"{region.name}: initializer {name} is bound to a tensor that is not the program's")
        initializers.append(
            {"name": name, "weight": target, "dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape)}
        )
    returned = next(n for n in reversed(region.torch_module.graph.nodes) if n.op == "output").args[0]
    values = [n.meta.get("val") for n in (returned if region.tuple_output else [returned])]
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise SaveError(f"{region.name} returns a value that is not a tensor")
    with graph.inserting_before(node):
        call = graph.call_function(REGION_OP, (tensors, sizes, rid))
    call.meta["val"] = list(values)
    call.meta["ort_lazy_arrangement"] = list(arrangement)
    if region.tuple_output:
        node.replace_all_uses_with(call)
        for user in call.users:
            if user.target is operator.getitem:
                user.meta["val"] = values[user.args[1]]
    else:
        with graph.inserting_after(call):
            item = graph.call_function(operator.getitem, (call, 0))
        item.meta["val"] = values[0]
        node.replace_all_uses_with(item)
    graph.erase_node(node)
    return _Region(rid, region, model, arrangement, size_symbols, initializers)


def _work_at_example(model: Any, example_sizes: Sequence[Sequence[int | None]]) -> None:
    """Estimate a symbolic model's work per run at the example's sizes (the ``work`` fact the
    runtime plans threads by: :func:`~ort_lazy.runtime.threads.region_plan`), where no
    estimate for every size exists."""
    if model.facts.get("work") is not None:
        return
    import onnx

    from ..runtime.threads import estimated_flops

    sizes: dict[str, int] = {}
    for spec, node_val in zip(model.input_specs, example_sizes):
        for dim, size in zip(spec.shape, node_val):
            if isinstance(dim, str) and size is not None:
                sizes.setdefault(dim, size)
    proto = onnx.load_from_string(model.model_bytes)
    for value in proto.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in sizes:
                dim.dim_value = sizes[dim.dim_param]
    del proto.graph.value_info[:]
    for value in proto.graph.output:
        value.type.tensor_type.ClearField("shape")
    try:
        model.facts["work"] = estimated_flops(proto.SerializeToString())
    except Exception:  # no estimate: the runtime plans as for unknown work
        model.facts["work"] = None


def _as_aten_layout(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``in_layout(value, order)`` (a Python function) as aten ops: the value copied with its
    dims laid out in ``order``."""
    value, order = node.args
    inverse = sorted(range(len(order)), key=order.__getitem__)
    val = node.meta.get("val", value.meta.get("val"))
    with graph.inserting_before(node):
        permuted = graph.call_function(_aten.permute.default, (value, list(order)))
        dense = graph.call_function(_aten.clone.default, (permuted,), {"memory_format": torch.contiguous_format})
        back = graph.call_function(_aten.permute.default, (dense, inverse))
    src = value.meta.get("val")
    if isinstance(src, torch.Tensor):
        permuted.meta["val"] = src.permute(list(order))
        dense.meta["val"] = permuted.meta["val"].clone(memory_format=torch.contiguous_format)
        back.meta["val"] = dense.meta["val"].permute(inverse)
    elif val is not None:
        back.meta["val"] = val
    node.replace_all_uses_with(back)
    graph.erase_node(node)


def _check_serializable(graph: torch.fx.Graph) -> None:
    """Every call is one a ``torch.export`` program holds: an operator, a getitem, or symbolic
    size arithmetic."""
    bad = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            bad.append(f"{node.op} {node.target}")
            continue
        target = node.target
        if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            continue
        if getattr(target, "__module__", None) in ("_operator", "operator", "math") or target in (torch.sym_max, torch.sym_min, torch.sym_not):
            continue
        bad.append(getattr(target, "__qualname__", str(target)))
    if bad:
        raise SaveError(f"the lowered graph has calls a torch.export program cannot hold: {sorted(set(bad))[:8]}")


def _direct_plan(program: ExportedProgram, input_specs: Sequence[Any]) -> dict[str, Any] | None:
    """How the direct path calls a program that is one region call on its user inputs
    (tensors, and sizes computed from theirs) whose outputs are the program's: {"region",
    "inputs": per model input the flat input's index, or {"expr": a size's expression over the
    inputs' symbolic dims}, "outputs": per program output the region output's index}; None for
    any other program."""
    graph = program.graph
    user = [n for n, s in zip(graph.nodes, input_specs) if s.kind == InputKind.USER_INPUT]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(user) or not all(isinstance(n.meta.get("val"), torch.Tensor) for n in user):
        return None
    symbols = {str(d.node.expr) for n in user for d in n.meta["val"].shape if isinstance(d, torch.SymInt)}
    calls = [n for n in graph.nodes if n.op == "call_function"]
    regions = [n for n in calls if n.target is REGION_OP]
    if len(regions) != 1:
        return None
    call = regions[0]
    tensors, sizes, rid = call.args
    if any(t not in user for t in tensors):
        return None
    exprs: dict[torch.fx.Node, str] = {}
    for size in sizes:
        val = size.meta.get("val") if isinstance(size, torch.fx.Node) else None
        if not isinstance(val, torch.SymInt):
            return None
        expr = str(val.node.expr)
        try:
            parse_dim(expr)
            if not dim_symbols(expr) <= symbols:
                return None
        except ValueError:
            return None
        exprs[size] = expr
    for n in calls:
        if n is call:
            continue
        if n.target is operator.getitem and n.args[0] is call:
            continue
        if n.target is _aten.sym_size.int or (n.target in PY_FUNCTIONS and n.target is not operator.getitem):
            continue  # size arithmetic: the expressions above stand for it
        return None
    if any(s.kind != OutputKind.USER_OUTPUT for s in program.graph_signature.output_specs):
        return None
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = list(output.args[0])
    if not all(isinstance(r, torch.fx.Node) and r.target is operator.getitem and r.args[0] is call for r in returned):
        return None
    region_inputs = [user.index(tensors[i]) if kind == "t" else {"expr": exprs[sizes[i]]} for kind, i in _arrangement(call)]
    return {"region": rid, "inputs": region_inputs, "outputs": [r.args[1] for r in returned]}


def _arrangement(call: torch.fx.Node) -> list[tuple[str, int]]:
    """The region call's model inputs in order, as (``t``, tensor index) / (``s``, size index):
    the order :func:`_as_region_call` recorded (kept on the node)."""
    return call.meta["ort_lazy_arrangement"]


#: Python functions a graph may call (size arithmetic, getitem), by the name the artifact records
PY_FUNCTIONS: dict[Any, str] = {
    operator.getitem: "getitem",
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.floordiv: "floordiv",
    operator.mod: "mod",
    operator.neg: "neg",
    operator.truediv: "truediv",
    operator.eq: "eq",
    operator.ne: "ne",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
    torch.sym_max: "sym_max",
    torch.sym_min: "sym_min",
    torch.sym_not: "sym_not",
    math.ceil: "ceil",
    math.floor: "floor",
}

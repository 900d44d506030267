"""TorchScript subgraph -> ONNX, for the groups the bridge cuts out of TorchScript graphs.

The TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) takes a
``torch.jit.ScriptFunction`` built from the subgraph and handles float64/32/16 and
int64/32 graphs with torch's type promotion in 3-6 ms. One model is exported per input
schema (dtype, shape, device), so every output shape is static and outputs can be bound
to preallocated tensors.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _compat
from ..specs import TORCH_TO_ONNX, OrtModel, TensorSpec
from .cleanup import clean_up

__all__ = ["OPSET", "COPY_TO_VIEW", "TorchScriptExportError", "export_torchscript"]

#: ONNX opset of exported groups (the TorchScript exporter supports opsets up to 20).
OPSET = 18


class TorchScriptExportError(RuntimeError):
    """The subgraph could not be exported to ONNX; the group runs in TorchScript."""


def export_torchscript(
    graph: torch._C.Graph,
    example_inputs: Sequence[torch.Tensor],
    *,
    name: str = "ts_group",
    no_fusion: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> OrtModel:
    """Export a TorchScript ``graph`` (tensor inputs, one tensor or a tuple out) to ONNX.

    Args:
        graph: the subgraph; it is copied, never modified.
        example_inputs: tensors with the dtypes, shapes and devices the model will get.
        name: a name for the model (shown in errors and metrics).
        no_fusion: a context manager that suspends the bridge's fusion pass, entered while
            the subgraph runs once (for the output specs) and while it is exported.

    Returns:
        An :class:`OrtModel` whose inputs are named ``in_<i>`` after the graph input they
        bind (inputs the exported model does not use are left out) and whose outputs are
        ``out_<j>``, with static specs.

    Raises:
        TorchScriptExportError: the exporter failed or produced an unexpected model.
    """
    graph = _views_for_copies(graph)
    args = tuple(t.detach() for t in example_inputs)
    if any(t.numel() == 0 for t in args):
        # nothing to compute; and the exporter's shape inference divides by zero (SIGFPE,
        # the process dies) reshaping an empty tensor with a -1 size
        raise TorchScriptExportError(f"{name}: an input is empty (nothing to compute)")
    in_names = [f"in_{i}" for i in range(len(args))]
    try:
        with no_fusion(), torch.no_grad():
            result = _compat.function_from_graph(name, graph.copy())(*args)
    except Exception as e:
        raise TorchScriptExportError(f"{name}: the subgraph failed to run: {type(e).__name__}: {e}") from e
    outs = result if isinstance(result, tuple) else (result,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise TorchScriptExportError(f"{name}: the subgraph returns non-tensor values")
    out_names = [f"out_{j}" for j in range(len(outs))]
    wanted = [TORCH_TO_ONNX.get(o.dtype) for o in outs]
    # The exporter types arithmetic between 0-d tensors with the default dtype: in a float64
    # graph, a product or sum of two 0-d tensors (a loss scale times a gradient of a sum, in
    # every backward) was computed in float32 and cast back (1e-8 off, silently), and a graph
    # of only such arithmetic came out float32. Graphs carrying float64 are exported under
    # float64, unless that export holds float32 values or an integer tensor meeting only a
    # number (0-d float32 arithmetic and an integer tensor times a Python float are float32
    # in eager, and would then be float64): those are exported under the default dtype.
    float64 = any(t.dtype == torch.float64 for t in (*args, *outs))
    proto = _export(graph, args, in_names, out_names, name, no_fusion, torch.float64) if float64 else None
    if proto is None or _default_dtype_matters(proto):
        proto = _export(graph, args, in_names, out_names, name, no_fusion, None)
    got = _output_types(proto)
    if got != wanted:
        # a graph of only 0-d arithmetic, typed by the default dtype: exported under the
        # dtype torch produced
        floats = {o.dtype for o, g, w in zip(outs, got, wanted) if g != w and o.dtype.is_floating_point}
        if len(floats) == 1 and next(iter(floats)) in (torch.float32, torch.float64):
            proto = _export(graph, args, in_names, out_names, name, no_fusion, floats.pop())
            got = _output_types(proto)
    if got != wanted:
        raise TorchScriptExportError(
            f"{name}: exported output types {got} differ from torch's {wanted} (ONNX element types)"
        )
    proto = _cleaned(proto)
    present = [i.name for i in proto.graph.input]
    produced = [o.name for o in proto.graph.output]
    if produced != out_names or any(n not in in_names for n in present):
        raise TorchScriptExportError(f"{name}: exported model has inputs {present} and outputs {produced}")
    model_bytes = proto.SerializeToString()
    by_name = dict(zip(in_names, args))
    return OrtModel(
        model_bytes=model_bytes,
        input_names=present,
        output_names=out_names,
        input_specs=[_spec(by_name[n]) for n in present],
        output_specs=[_spec(o) for o in outs],
        name=name,
    )


def _cleaned(proto: Any) -> Any:
    """``proto`` after :func:`~ort_lazy.export.cleanup.clean_up` (the exporter's own constant
    folding leaves reshape chains and the reshapes around matrix products); ``proto`` itself
    when it cannot be read as an ``onnx_ir`` model (the clean-up counts its own faults)."""
    import onnx_ir as ir

    try:
        model = ir.serde.deserialize_model(proto)
    except Exception:
        return proto
    clean_up(model)
    return ir.serde.serialize_model(model)


#: Functionalized graphs (LazyTensor) use the ``*_copy`` forms of view ops, which the
#: TorchScript exporter does not know; with no mutation in the graph the views are equal.
COPY_TO_VIEW = {
    f"aten::{name}_copy": f"aten::{name}"
    for name in (
        "alias", "as_strided", "detach", "diagonal", "expand", "narrow", "permute", "select",
        "slice", "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind", "unfold",
        "unsqueeze", "view",
    )
}


def _views_for_copies(graph: torch._C.Graph) -> torch._C.Graph:
    """A copy of ``graph`` with ``aten::view_copy`` and friends replaced by their views."""
    graph = graph.copy()
    nodes: list[torch._C.Node] = []
    for kind in COPY_TO_VIEW:
        nodes.extend(graph.findAllNodes(kind, True))
    if any(n.schema() != "(no schema)" and "!" in n.schema() for n in graph.nodes()):
        return graph  # a mutating node might observe the aliasing: keep the copies
    for node in nodes:
        view = graph.create(COPY_TO_VIEW[node.kind()], list(node.inputs()), node.outputsSize())
        view.insertBefore(node)
        for old, new in zip(node.outputs(), view.outputs()):
            new.setType(old.type())
            old.replaceAllUsesWith(new)
        node.destroy()
    return graph


def _spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(dtype=t.dtype, shape=tuple(int(s) for s in t.shape), device=t.device)


def _export(
    graph: torch._C.Graph,
    args: tuple[torch.Tensor, ...],
    in_names: list[str],
    out_names: list[str],
    name: str,
    no_fusion: Callable[[], contextlib.AbstractContextManager[Any]],
    default_dtype: torch.dtype | None,
) -> Any:
    import onnx

    # The exporter rewrites the function's graph in place: give it its own copy.
    fn = _compat.function_from_graph(name, graph.copy())
    buf = io.BytesIO()
    previous = torch.get_default_dtype()
    try:
        with no_fusion(), torch.no_grad(), warnings.catch_warnings(), _compat.torchscript_exporter_log_kept():
            warnings.simplefilter("ignore")
            if default_dtype is not None:
                torch.set_default_dtype(default_dtype)
            torch.onnx.export(
                fn,
                args,
                buf,
                dynamo=False,
                opset_version=OPSET,
                input_names=in_names,
                output_names=out_names,
                do_constant_folding=True,
            )
    except Exception as e:
        raise TorchScriptExportError(f"{name}: {type(e).__name__}: {e}") from e
    finally:
        torch.set_default_dtype(previous)
    return onnx.load_from_string(buf.getvalue())


def _default_dtype_matters(proto: Any) -> bool:
    """Whether a model exported under float64 holds float32 values, or an integer tensor (of
    rank 1 or more) meets only numbers in arithmetic: constants or 0-d inputs, which is how
    LazyTensor passes a Python number (eager types ``int_tensor * 0.1`` float32, the default
    dtype; an integer meeting a float64 tensor is float64 in both)."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # types unknown: the default dtype's export, as before float64 exports
        return True
    graph = model.graph
    values = (*graph.input, *graph.value_info, *graph.output)
    types = {v.name: v.type.tensor_type.elem_type for v in values}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in values if v.type.tensor_type.HasField("shape")}
    types.update((t.name, t.data_type) for t in graph.initializer)
    numbers = {t.name for t in graph.initializer}
    numbers.update(v.name for v in graph.input if len(v.type.tensor_type.shape.dim) == 0)
    for node in graph.node:
        if node.op_type == "Constant":
            numbers.update(node.output)
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    if onnx.TensorProto.FLOAT in types.values():
        return True
    # an integer tensor widened to DOUBLE; a 0-d one is taken for a number (the element count
    # a deviation's backward divides by: float64 in eager), not an integer tensor meeting a
    # Python float (``torch.tensor(3) * 0.1``, rarer; float32 in eager, float64 here)
    widened = {
        node.output[0]
        for node in graph.node
        if node.op_type == "Cast"
        and types.get(node.input[0]) in _INTEGER_TYPES
        and ranks.get(node.input[0]) != 0
        and any(a.name == "to" and a.i == onnx.TensorProto.DOUBLE for a in node.attribute)
    }
    for node in graph.node:
        operands = [i for i in node.input if i]
        if types.get(node.output[0]) == onnx.TensorProto.DOUBLE and any(i in widened for i in operands):
            others = [i for i in operands if i not in widened]
            if others and all(i in numbers for i in others):
                return True
    return False


_INTEGER_TYPES = {
    TORCH_TO_ONNX[t] for t in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
}


def _output_types(proto: Any) -> list[int | None]:
    return [o.type.tensor_type.elem_type or None for o in proto.graph.output]

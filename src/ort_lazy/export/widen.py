"""float16 / bfloat16 ops ORT has no kernel for, computed in float32 between casts, per op.

ORT's CPU provider has bfloat16 kernels for few ops (no Add, Mul, MatMul ...) and inserts no
casts for them, so a bfloat16 graph would fall back to PyTorch almost entirely. For float16 it
does insert casts, but around whole chains of such ops, keeping the values between them in
float32: where eager's float16 result of one op overflows (``exp`` of 30 is inf in float16),
ORT's chain goes on with the float32 value and the results differ.

PyTorch's own CPU kernels compute a float16 / bfloat16 op in float32 and round its result
once; doing the same per ONNX node (Cast to float, the op, Cast back) gives eager's values
(up to the order of float32 accumulation in matrix products and reductions). Only nodes with
no kernel in their dtype but a float one on the chosen providers are widened; a provider with
such kernels (CUDA) keeps its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .emitter import cast_node, take_output_name

__all__ = ["widen_low_precision"]


def _has_low_precision(model: Any) -> bool:
    import onnx_ir as ir

    low = (ir.DataType.BFLOAT16, ir.DataType.FLOAT16)
    values = list(model.graph.inputs) + list(model.graph.outputs)
    values += [o for node in model.graph for o in node.outputs]
    return any(v.dtype in low for v in values)


def widen_low_precision(model: Any, providers: Sequence[str]) -> Any:
    """``model`` (``onnx_ir``) with float16 / bfloat16 nodes the providers have no kernel for
    computed in float32, each between its own casts.

    Returns ``model`` itself when it holds no such value; otherwise a new model with local
    functions inlined (so every node is typed) and the widened nodes wrapped in casts.
    """
    if not _has_low_precision(model):
        return model
    import onnx
    import onnx.inliner
    import onnx_ir as ir

    from ..runtime.kernels import kernel_registry, node_bindings, node_opset

    proto = onnx.inliner.inline_local_functions(ir.serde.serialize_model(model))
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # untyped values stay untyped; those nodes are left as they are
        pass
    model = ir.serde.deserialize_model(proto)
    registry = kernel_registry()
    opsets = dict(model.opset_imports)
    low, f32 = ("tensor(bfloat16)", "tensor(float16)"), "tensor(float)"
    graph = model.graph
    for node in list(graph):
        if any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()):
            continue  # control flow: its subgraphs are typed separately
        domain, opset = node_opset(node, opsets)
        bindings = node_bindings(node, domain, opset)
        if not any(v in low for v in bindings.values()):
            continue
        if registry.has_kernel(domain, node.op_type, opset, providers, bindings, exact=True):
            continue
        widened = {k: (f32 if v in low else v) for k, v in bindings.items()}
        if not registry.has_kernel(domain, node.op_type, opset, providers, widened):
            continue
        _wrap_in_casts(graph, node)
    return model


def _wrap_in_casts(graph: Any, node: Any) -> None:
    """Cast the node's float16 / bfloat16 inputs to float and its outputs back (in place)."""
    import onnx_ir as ir

    low, f32 = (ir.DataType.BFLOAT16, ir.DataType.FLOAT16), ir.DataType.FLOAT
    base = node.name or node.op_type
    for i, value in enumerate(list(node.inputs)):
        if value is not None and value.dtype in low:
            cast = cast_node(value, f32, f"{base}_widen_in{i}")
            graph.insert_before(node, cast)
            node.replace_input_with(i, cast.outputs[0])
    for j, value in enumerate(node.outputs):
        if value.dtype not in low:
            continue
        original = value.dtype
        uses = list(value.uses())
        value.dtype = f32
        cast = cast_node(value, original, f"{base}_narrow_out{j}")
        graph.insert_after(node, cast)
        narrowed = cast.outputs[0]
        for use in uses:
            use.node.replace_input_with(use.idx, narrowed)
        if not take_output_name(graph, value, narrowed, "_float"):
            narrowed.name = f"{value.name}_narrow"

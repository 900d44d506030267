"""``precision="fp16"``: inference regions computed in float16 by ORT.

Applied, like ``int8-dynamic``, to the regions of inference graphs that bind the model's weights
(``export_graph`` with baked constants); training graphs keep their dtypes.

Every node of a region that computes on float32 values runs in float16 instead, where

- the chosen providers have a float16 kernel for it (read from ORT's kernel registry: a node
  ORT could not run is never made), and
- float16 keeps what the result needs: :data:`FLOAT32_OPS` (exponentials, logarithms, powers
  and sums over many elements, the ops PyTorch's autocast keeps in float32 for the same reason),
  casts and constants, and control flow (``If``, ``Loop``: their bodies read outer values by
  name) stay float32.

A ``Cast`` is inserted wherever a value crosses between the two: the region's inputs and
outputs stay float32, so the PyTorch code around the region is unchanged; baked weights and
constants become float16 initializers (finite values clipped to float16's range, so
``finfo(float32).min`` in an attention mask stays finite). A region narrows only where one of
its :data:`PRODUCT_OPS` can: ORT's CPU provider has float16 kernels for moving values and layer
norms but none for matrix products or arithmetic, so on the CPU regions stay float32. Worth it
where the provider computes float16 faster than float32 (a GPU's tensor cores, ORT's CUDA
provider). Results are approximate (float16 has 11 significant bits and overflows past
65504); ``explain`` reports the distance from eager PyTorch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .emitter import cast_node, take_output_name

__all__ = ["FLOAT32_OPS", "PRODUCT_OPS", "float32_products", "narrow_to_float16"]

#: op types kept in float32 inside a float16 region: float16's range (65504) or its 11-bit
#: sums would change results that float32 computes well
FLOAT32_OPS = frozenset(
    {
        "Exp", "Log", "Pow", "Reciprocal", "Softplus", "CumSum",
        "ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
        "ReduceL1", "ReduceL2", "LpNormalization",
        # values made from attributes or conversions: their float16 consumers read a float16
        # copy of the constant behind them (or cast at run time)
        "Cast", "CastLike", "Constant", "ConstantOfShape",
    }
)

#: the compute float16 is for: a region narrows only where at least one of these can (ORT's CPU
#: provider has float16 kernels for moving values and layer norms, none for products or
#: arithmetic: casts around those alone would cost and gain nothing)
PRODUCT_OPS = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul", "FusedGemm", "FusedConv", "Attention", "MultiHeadAttention"}
)

#: product ops whose CPU float16 kernel is slower than its float32 one: they do not make a CPU
#: region narrow (ONNX's ``Attention``, BERT-sized, 2 cores: 284 us in float16, 181 in float32)
CPU_SLOW_HALF_OPS = frozenset({"Attention"})

_FLOAT, _FLOAT16 = "tensor(float)", "tensor(float16)"


def _formals(node: Any, domain: str, opset: int) -> tuple[list[str], list[str]]:
    """The schema's type string for each input and output of ``node`` (variadic ones repeat
    the last formal), empty strings where the schema is unknown."""
    from ..runtime.kernels import _schema_io

    ins, outs = _schema_io(node.op_type, opset, domain)

    def per(formals: tuple[str, ...], n: int) -> list[str]:
        if not formals:
            return [""] * n
        return [formals[min(i, len(formals) - 1)] for i in range(n)]

    return per(ins, len(node.inputs)), per(outs, len(node.outputs))


def _half_nodes(
    model: Any, providers: Sequence[str], registry: Any, exact: bool
) -> dict[Any, tuple[list[int], list[int]]]:
    """The top-level nodes that run in float16: node -> (indices of the inputs, of the outputs)
    that become float16; empty when none of :data:`PRODUCT_OPS` could."""
    import onnx_ir as ir

    from ..runtime.kernels import node_bindings, node_opset

    opsets = dict(model.opset_imports)
    chosen: dict[Any, tuple[list[int], list[int]]] = {}
    for node in model.graph:
        if node.op_type in FLOAT32_OPS or any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()
        ):
            continue
        domain, opset = node_opset(node, opsets)
        if not registry.knows(domain, node.op_type):
            continue
        bindings = node_bindings(node, domain, opset)
        in_formals, out_formals = _formals(node, domain, opset)
        # the float constraints of its inputs (an output-only one follows an attribute, such as
        # LayerNormalization's statistics ``U`` its ``stash_type``): all in float16, else one
        floats = [k for k, v in bindings.items() if v == _FLOAT and k in in_formals]
        for narrowed in [set(floats)] + ([{k} for k in floats] if len(floats) > 1 else []):
            half = {k: (_FLOAT16 if k in narrowed else v) for k, v in bindings.items()}
            if registry.has_kernel(domain, node.op_type, opset, providers, half, exact=exact):
                break
        else:
            continue
        ins = [i for i, (v, f) in enumerate(zip(node.inputs, in_formals)) if v is not None and f in narrowed]
        outs = [i for i, f in enumerate(out_formals) if f in narrowed]
        if ins:  # computes on float32 values (not only makes them from attributes)
            chosen[node] = (ins, outs)
    products = PRODUCT_OPS - CPU_SLOW_HALF_OPS if list(providers) == ["CPUExecutionProvider"] else PRODUCT_OPS
    if not any(node.op_type in products for node in chosen):
        return {}
    return chosen


def _half_constant(graph: Any, value: Any) -> Any:
    """A float16 initializer holding the float32 constant ``value`` (an initializer, a
    ``Constant``'s output, or a ``Cast`` / ``CastLike`` of a floating-point one), finite values
    beyond float16's range clipped to +-65504 (the ``finfo.min`` of attention masks stays a
    large negative number, not -inf); None when ``value`` is not a constant."""
    import numpy as np
    import onnx_ir as ir
    from onnx_ir.convenience import get_const_tensor

    source = value
    producer = value.producer()
    if producer is not None and producer.op_type in ("Cast", "CastLike") and producer.inputs[0] is not None:
        source = producer.inputs[0]  # a scalar the translation casts to its operand's type
    try:
        tensor = get_const_tensor(source)
    except Exception:  # a malformed Constant: cast at run time
        return None
    if tensor is None or not tensor.dtype.is_floating_point():
        return None
    data = np.asarray(tensor.numpy(), dtype=np.float32)
    limit = float(np.finfo(np.float16).max)
    half = np.where(np.isfinite(data), np.clip(data, -limit, limit), data).astype(np.float16)
    name = f"{value.name}_half"
    out = ir.Value(name=name, const_value=ir.tensor(half, name=name), shape=ir.Shape(half.shape), type=ir.TensorType(ir.DataType.FLOAT16))
    graph.register_initializer(out)
    return out


def float32_products(model: Any) -> int:
    """How many of ``model``'s (``onnx_ir``) top-level :data:`PRODUCT_OPS` compute in float32."""
    import onnx_ir as ir

    return sum(
        1 for node in model.graph
        if node.op_type in PRODUCT_OPS and any(v is not None and v.dtype == ir.DataType.FLOAT for v in node.inputs)
    )


def narrow_to_float16(model: Any, providers: Sequence[str], *, exact: bool = True) -> int:
    """Run ``model``'s (``onnx_ir``) float32 nodes in float16 where ``providers`` have float16
    kernels (see the module docstring), in place; returns how many nodes were narrowed.
    ``exact=False`` also counts the float16 nodes ORT's CPU provider runs by casting around
    its float32 kernel (each op computed in float32 and rounded, as PyTorch's CPU kernels do
    for float16): the same graph a GPU gets, runnable on a CPU, with no speed gain there."""
    import onnx_ir as ir

    from ..runtime.kernels import kernel_registry

    graph = model.graph
    chosen = _half_nodes(model, providers, kernel_registry(), exact)
    f32, f16 = ir.DataType.FLOAT, ir.DataType.FLOAT16
    narrowed_values = set()
    for node, (_, outs) in chosen.items():
        for j in outs:
            value = node.outputs[j]
            if value.dtype in (f32, None):  # untyped: float32 by the node's other values
                value.dtype = f16
                narrowed_values.add(value)
    # float32 values into float16 nodes: one Cast per value, before its first such consumer
    to_half: dict[Any, Any] = {}
    for node in list(graph):
        if node not in chosen:
            continue
        for i in chosen[node][0]:
            value = node.inputs[i]
            if value.dtype not in (f32, None):  # untyped (a Constant's output): cast all the same
                continue
            narrow = to_half.get(value)
            if narrow is None:
                narrow = _half_constant(graph, value)
                if narrow is None:
                    cast = cast_node(value, f16, f"{value.name}_to_half")
                    graph.insert_before(node, cast)
                    narrow = cast.outputs[0]
                to_half[value] = narrow
            node.replace_input_with(i, narrow)
    # float16 values read as float32: by other nodes (subgraphs included) and as outputs
    for value in narrowed_values:
        readers = [u for u in value.uses() if u.node not in chosen or u.idx not in chosen[u.node][0]]
        if not readers and not value.is_graph_output():
            continue
        cast = cast_node(value, f32, f"{value.name}_to_float")
        graph.insert_after(value.producer(), cast)
        for use in readers:
            use.node.replace_input_with(use.idx, cast.outputs[0])
        take_output_name(graph, value, cast.outputs[0], "_half")
    # weights now read only as their float16 copies: not carried twice
    for value in to_half:
        if value.is_initializer() and not value.uses() and not value.is_graph_output():
            graph.initializers.pop(value.name, None)
    return len(chosen)

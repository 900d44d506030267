"""aten FX graph -> ONNX, with the exporter's direct translator (milliseconds, symbolic dims kept)."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.fx

from .. import _compat, metrics
from ..runtime.session import OrtModel, TensorSpec

__all__ = ["ExportError", "translate", "export_graph", "single_node_graph", "spec_of"]


class ExportError(RuntimeError):
    """The graph could not be translated to ONNX."""


def spec_of(value: Any) -> TensorSpec:
    """The :class:`TensorSpec` of an FX meta value (tensor, or SymInt/int for scalars)."""
    if isinstance(value, torch.Tensor):
        shape = tuple(d if isinstance(d, int) else str(d.node) for d in value.shape)
        return TensorSpec(value.dtype, shape, value.device)
    # Python scalars become 0-d tensors of the type the translator declares for them.
    if isinstance(value, (bool, torch.SymBool)):
        return TensorSpec(torch.bool, (), torch.device("cpu"), scalar=True)
    if isinstance(value, (float, torch.SymFloat)):
        return TensorSpec(torch.float32, (), torch.device("cpu"), scalar=True)
    return TensorSpec(torch.int64, (), torch.device("cpu"), scalar=True)


def single_node_graph(node: torch.fx.Node) -> torch.fx.GraphModule:
    """A graph holding just ``node``, its tensor/SymInt inputs turned into placeholders."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}

    def placeholder(n: torch.fx.Node) -> torch.fx.Node:
        if n not in env:
            p = graph.placeholder(f"in_{len(env)}")
            p.meta["val"] = n.meta.get("val", n.meta.get("example_value"))
            env[n] = p
        return env[n]

    new = graph.node_copy(node, placeholder)
    new.meta = dict(node.meta)
    graph.output(new)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def translate(gm: torch.fx.GraphModule, name: str = "region") -> Any:
    """Translate ``gm`` (aten ops, placeholders with ``meta['val']``) to an ``onnx_ir`` model."""
    gm = _prepare(gm)
    model = _compat.new_ir_model(name)
    _compat.translate_fx_graph(gm.graph, model)
    _dedupe_outputs(model)
    _compat.finalize_ir_model(model)
    return model


def _prepare(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy with explicit type promotion and no dead code."""
    graph = copy.deepcopy(gm.graph)
    out = torch.fx.GraphModule(gm, graph)
    for node in out.graph.nodes:
        node.meta.pop("stack_trace", None)
    _compat.insert_type_promotion(out)
    return out


def _dedupe_outputs(model: Any) -> None:
    """Give every graph output its own value (an input or a repeated value gets an Identity)."""
    import onnx_ir as ir

    seen: set[int] = set()
    inputs = {id(v) for v in model.graph.inputs}
    outputs = list(model.graph.outputs)
    changed = False
    for i, value in enumerate(outputs):
        if id(value) in seen or id(value) in inputs or value.const_value is not None:
            node = ir.Node("", "Identity", inputs=[value], num_outputs=1, name=f"out_identity_{i}")
            new = node.outputs[0]
            new.name = f"{value.name}_out{i}"
            new.dtype = value.dtype
            new.shape = value.shape
            model.graph.append(node)
            outputs[i] = new
            changed = True
        seen.add(id(outputs[i]))
    if changed:
        model.graph.outputs.clear()
        model.graph.outputs.extend(outputs)


def export_graph(gm: torch.fx.GraphModule, name: str = "region") -> OrtModel:
    """Translate ``gm`` and package it with its torch-side input/output specs.

    Raises:
        ExportError: the translator failed; the message names the node.
    """
    import onnx_ir as ir

    start = time.perf_counter()
    try:
        model = translate(gm, name)
        proto = ir.serde.serialize_model(model)
    except Exception as e:
        raise ExportError(f"{name}: {e}") from e
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    out_args = output_node.args[0]
    out_nodes = list(out_args) if isinstance(out_args, (tuple, list)) else [out_args]
    in_specs = [spec_of(p.meta.get("val")) for p in placeholders]
    out_specs = [spec_of(n.meta.get("val") if isinstance(n, torch.fx.Node) else n) for n in out_nodes]
    result = OrtModel(
        model_bytes=proto.SerializeToString(),
        input_names=[i.name for i in proto.graph.input],
        output_names=[o.name for o in proto.graph.output],
        input_specs=in_specs,
        output_specs=out_specs,
        name=name,
    )
    if len(result.input_names) != len(placeholders) or len(result.output_names) != len(out_nodes):
        raise ExportError(
            f"{name}: ONNX model has {len(result.input_names)} inputs / {len(result.output_names)} "
            f"outputs, graph has {len(placeholders)} / {len(out_nodes)}"
        )
    metrics.record_time("export", time.perf_counter() - start)
    return result

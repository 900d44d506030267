"""Packaging a lowered model as an artifact's members: ``graph.json`` (the program's graph as the
loader runs it: JSON, no pickle), ``weights.bin`` (every weight at an aligned offset), each
region's ONNX model, and the manifest describing them (:func:`package`).
"""

from __future__ import annotations

import io
import math
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

from .._version import __version__
from ..export.fx import spec_of
from ..opnames import op_name
from ..runtime.artifact_format import FORMAT, FORMAT_VERSION, GRAPH, PROGRAM, WEIGHT_ALIGNMENT, WEIGHTS
from ..runtime.artifact_regions import REGION_OP
from ..runtime.flavour import onnxruntime
from ..runtime.region import compute_ops
from ..specs import spec_to_json
from .save_capture import _CPU, PY_FUNCTIONS, Lowered, SaveError, _Region

__all__ = ["encode_graph", "package"]


# -- the graph the loader runs ---------------------------------------------------------------------

_LAYOUTS = {torch.strided: "strided", torch.sparse_coo: "sparse_coo"}
_MEMORY_FORMATS = {
    torch.contiguous_format: "contiguous_format",
    torch.channels_last: "channels_last",
    torch.channels_last_3d: "channels_last_3d",
    torch.preserve_format: "preserve_format",
}


def encode_graph(program: ExportedProgram, regions: Sequence[_Region]) -> dict[str, Any]:
    """The program's graph as the loader runs it (JSON: no pickle, no ``torch.export.load``):
    placeholders as user inputs or weights (``weights.bin``), operators by name with their
    schema, region calls by id, the outputs."""
    graph = program.graph
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    index: dict[torch.fx.Node, int] = {}
    nodes: list[dict[str, Any]] = []
    users = 0
    outputs: Any = None

    def encode(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return {"node": index[value]}
        if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": str(value)}
        if isinstance(value, (list, tuple)):
            return {"list" if isinstance(value, list) else "tuple": [encode(v) for v in value]}
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).replace("torch.", "")}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, torch.layout) and value in _LAYOUTS:
            return {"layout": _LAYOUTS[value]}
        if isinstance(value, torch.memory_format) and value in _MEMORY_FORMATS:
            return {"memory_format": _MEMORY_FORMATS[value]}
        raise SaveError(f"the graph holds a {type(value).__name__} argument ({value!r:.60}), which a saved model cannot")

    for node in graph.nodes:
        entry: dict[str, Any]
        if node.op == "placeholder":
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                entry = {"input": users}
                users += 1
            else:
                entry = {"weight": spec.target}
        elif node.op == "call_function" and node.target is REGION_OP:
            tensors, sizes, rid = node.args
            entry = {"region": rid, "tensors": encode(tensors), "sizes": encode(sizes)}
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            op = node.target
            entry = {
                "op": op_name(op),
                "schema": str(op._schema),
                "args": encode(node.args),
                "kwargs": {k: encode(v) for k, v in node.kwargs.items()},
            }
        elif node.op == "call_function" and node.target in PY_FUNCTIONS:
            entry = {"fn": PY_FUNCTIONS[node.target], "args": encode(node.args)}
        elif node.op == "output":
            outputs = encode(list(node.args[0]))
            continue
        else:
            raise SaveError(f"the graph calls {node.op} {node.target}, which a saved model cannot hold")
        index[node] = len(nodes)
        nodes.append(entry)
    return {"nodes": nodes, "outputs": outputs}


# -- packaging ------------------------------------------------------------------------------------


def _weights_blob(weights: Mapping[str, torch.Tensor]) -> tuple[bytes, dict[str, Any]]:
    """``weights.bin``'s bytes and its index (each weight at a multiple of the alignment)."""
    chunks: list[bytes] = []
    index: dict[str, Any] = {}
    offset = 0
    for name, tensor in weights.items():
        data = _tensor_bytes(tensor)
        pad = -offset % WEIGHT_ALIGNMENT
        chunks.append(b"\0" * pad)
        offset += pad
        index[name] = {"dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape), "offset": offset, "nbytes": len(data)}
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks), index


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    t = tensor.detach().cpu().contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _model_versions(model_bytes: bytes) -> tuple[int, dict[str, int]]:
    import onnx

    proto = onnx.ModelProto()
    proto.ParseFromString(model_bytes)
    return int(proto.ir_version), {o.domain: int(o.version) for o in proto.opset_import}


def _symbol_ranges(program: ExportedProgram) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for symbol, bounds in program.range_constraints.items():
        low, high = bounds.lower, bounds.upper
        out[str(symbol)] = [int(low) if _finite(low) else None, int(high) if _finite(high) else None]
    return out


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def package(lowered: Lowered, with_program: bool = False) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and members of the artifact for ``lowered`` (``with_program``: also the
    ``torch.export`` program)."""
    import json

    import onnx

    program = lowered.program
    members: dict[str, bytes] = {GRAPH: json.dumps(encode_graph(program, lowered.regions)).encode()}
    if with_program:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        members[PROGRAM] = buffer.getvalue()
    blob, index = _weights_blob(lowered.weights)
    if index:
        members[WEIGHTS] = blob
    regions = []
    for r in lowered.regions:
        members[f"regions/{r.id}.onnx"] = r.model.model_bytes
        ir_version, opsets = _model_versions(r.model.model_bytes)
        entry: dict[str, Any] = {
            "id": r.id,
            "model": r.model.describe(),
            "arrangement": [list(a) for a in r.arrangement],
            "size_symbols": r.size_symbols,
            "ops": sorted(set(compute_ops(r.region.torch_module))),
            "initializers": r.initializers,
            "ir_version": ir_version,
            "opsets": opsets,
        }
        if r.region.runner is not None and r.region.runner.ep_nodes:
            entry["ep_nodes"] = dict(r.region.runner.ep_nodes)
        regions.append(entry)
    call_spec = program.call_spec
    in_spec = call_spec.in_spec
    args_part, kwargs_part = pytree.tree_unflatten([0] * in_spec.num_leaves, in_spec)
    n_args, n_kwargs = len(pytree.tree_leaves(args_part)), len(pytree.tree_leaves(kwargs_part))
    user = lowered.user_inputs
    options = lowered.options
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": {
            "torch": torch.__version__,
            "onnxruntime": onnxruntime().__version__,
            "ort_lazy": __version__,
            "onnx": onnx.__version__,
            "python": platform.python_version(),
        },
        "providers": list(options.resolve_providers(_CPU)),
        "options": {
            "precision": options.precision,
            "fast_math": options.fast_math,
            "prepack_weights": options.prepack_weights,
            "freeze_weights": options.freeze_weights,
            "torch_executed_ops": sorted(options.torch_executed_ops),
        },
        "inputs": {
            "spec": pytree.treespec_dumps(in_spec),
            "names": [n.name for n in user],
            "positional": n_args if n_kwargs == 0 else -1,
            "specs": [spec_to_json(spec_of(n.meta.get("val"))) if isinstance(n.meta.get("val"), torch.Tensor) else None for n in user],
        },
        "outputs": {"spec": pytree.treespec_dumps(call_spec.out_spec)},
        "ranges": _symbol_ranges(program),
        "regions": regions,
        "weights": index,
        "pytorch_ops": lowered.pytorch_ops,
        "direct": lowered.direct,
    }
    return manifest, members

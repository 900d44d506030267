"""Save a model as ort-lazy runs it: one artifact (:func:`save`) or one ONNX file (:func:`export_onnx`).

The model is captured with ``torch.export.export`` (eval mode, no grad), decomposed with
ort-lazy's table and lowered and partitioned as the dynamo door does
(:func:`~ort_lazy.lowering.aten.lower_exported`). Each ORT region becomes a call of the
``ort_lazy::region`` op (:data:`~ort_lazy.runtime.artifact_regions.REGION_OP`) in the program,
which keeps the PyTorch code between regions; the artifact holds the program, the regions' ONNX
models and the weights bound to them (:mod:`ort_lazy.runtime.artifact` describes the layout
and loads it).

Capture and lowering are in :mod:`~ort_lazy.frontends.save_capture`, the artifact's members and
manifest made in :mod:`~ort_lazy.frontends.save_package`; here are the public functions, the
check of a saved model against the model, and the ONNX file's writing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from .. import metrics
from ..options import Options
from ..runtime import artifact as art
from ..runtime.artifact_format import summary, write_artifact
from .save_capture import (
    PY_FUNCTIONS,
    Lowered,
    SaveError,
    _plain,
    _Region,
    _split_inputs,
    _state_tensor,
    capture,
    lower,
)
from .save_package import _tensor_bytes, encode_graph, package
from .settings import resolve_options

__all__ = ["SaveError", "save", "export_onnx", "Lowered", "capture", "lower", "package", "encode_graph", "PY_FUNCTIONS"]


# -- the public functions ---------------------------------------------------------------------------


def save(
    model: torch.nn.Module,
    example_inputs: Any,
    path: str | os.PathLike[str],
    *,
    dynamic_shapes: Any = None,
    verify: bool = True,
    program: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Capture, lower and partition ``model`` as ort-lazy runs it, and write one artifact.

    ``example_inputs``: a tuple of positional inputs, a dict of keyword inputs, or one tensor.
    ``dynamic_shapes``: as ``torch.export.export`` takes it (``torch.export.Dim`` per dynamic
    dim); other dims are fixed at the example's sizes. ``options``: ort-lazy
    :class:`~ort_lazy.options.Options` fields that shape the compiled model (``torch_executed_ops``,
    ``precision``, ``fast_math``, ``min_block_size`` ...); providers and session options are
    chosen when loading. ``verify``: load the artifact back and compare its outputs with the
    model's on the example inputs (``rtol``/``atol`` options), removing it on a mismatch.
    ``program``: also keep the ``torch.export`` program (ORT regions as ``ort_lazy::region``
    calls) for tools that read one (:attr:`~ort_lazy.runtime.artifact.LoadedModel.program`);
    loading never needs it. It holds its own copy of the weights its PyTorch ops read.

    The model is captured in eval mode without grad (its mode is restored). Outputs come back
    from the loaded model as plain containers: a Hugging Face ``ModelOutput`` as a dict.

    Returns :func:`ort_lazy.runtime.artifact.summary` of the artifact.

    Raises:
        SaveError: the model cannot be saved (the message says why).
    """
    opts = resolve_options(None, **options)
    args, kwargs = _split_inputs(example_inputs)
    exported = capture(model, args, kwargs, dynamic_shapes, opts)
    lowered = lower(exported, opts)
    manifest, members = package(lowered, with_program=program)
    write_artifact(path, manifest, members)
    metrics.increment("artifacts_saved")
    if verify:
        try:
            _verify(path, model, args, kwargs, opts)
        except BaseException:
            os.unlink(path)
            raise
    return summary(path)


def _verify(path: str | os.PathLike[str], model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], options: Options) -> None:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = pytree.tree_leaves(_plain(model(*args, **kwargs)))
    finally:
        model.train(was_training)
    loaded = art.load(path, options)
    with torch.no_grad():
        actual = pytree.tree_leaves(loaded(*args, **kwargs))
    if len(actual) != len(expected):
        raise SaveError(f"the saved model returns {len(actual)} values, the model {len(expected)}")
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not isinstance(e, torch.Tensor):
            if a != e:
                raise SaveError(f"output {i}: the saved model returns {a!r}, the model {e!r}")
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            raise SaveError(f"output {i}: the saved model returns {a.dtype}{tuple(a.shape)}, the model {e.dtype}{tuple(e.shape)}")
        if e.is_floating_point() and e.numel():
            scale = float(e.abs().max()) if torch.isfinite(e).all() else 1.0
            ok = torch.allclose(a, e, rtol=options.rtol, atol=options.atol * max(1.0, scale), equal_nan=True)
        else:
            ok = torch.equal(a, e)
        if not ok:
            diff = float((a.double() - e.double()).abs().max()) if e.numel() else 0.0
            raise SaveError(f"output {i}: the saved model differs from the model on the example inputs (max |diff| {diff:.3g})")


def export_onnx(
    model: torch.nn.Module,
    example_inputs: Any,
    path: str | os.PathLike[str],
    *,
    dynamic_shapes: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Write ``model`` as one ONNX file, exactly as ort-lazy runs it (its rewrites and fusions),
    weights included, for a model whose every op runs on ORT.

    Inputs are named as the model's arguments (keyword inputs by their keys), outputs by
    their keys (``logits``) or ``output_<i>``; dynamic dims are named after the
    ``torch.export.Dim`` given for them. Weights past 2 GiB go to ``<path>.data`` (ONNX external
    data). The file runs with a plain ``onnxruntime.InferenceSession``. Returns the input and
    output names and the path(s) written.

    Raises:
        SaveError: part of the model would stay in PyTorch (the message names its ops), or
            the graph computes sizes outside ORT.
    """
    import onnx

    opts = resolve_options(None, **options)
    args, kwargs = _split_inputs(example_inputs)
    program = capture(model, args, kwargs, dynamic_shapes, opts)
    lowered = lower(program, opts)
    if lowered.direct is None:
        if lowered.pytorch_ops:
            raise SaveError(
                f"not every op runs on ORT; these would stay in PyTorch: {', '.join(lowered.pytorch_ops)} "
                "(ort_lazy.explain(model, *inputs) says why; ort_lazy.save keeps them in the artifact)"
            )
        raise SaveError(
            f"the model is {len(lowered.regions)} ORT regions with size arithmetic between them, not one ONNX graph "
            "(ort_lazy.save keeps such a model)"
        )
    region = lowered.regions[0]
    proto = onnx.ModelProto()
    proto.ParseFromString(region.model.model_bytes)
    _fill_initializers(proto, region, lowered.weights, lowered.program)
    in_names = [n.name for n in lowered.user_inputs]
    picks = lowered.direct["inputs"]
    out_names = _output_names(lowered.program.call_spec.out_spec)
    dims = _dim_names(dynamic_shapes, args, kwargs, lowered)
    tensor_inputs = [(value.name, in_names[pick]) for value, pick in zip(proto.graph.input, picks) if isinstance(pick, int)]
    _rename(proto, dict(tensor_inputs), out_names, lowered.direct["outputs"], dims)
    _sizes_from_shapes(proto, picks, in_names, lowered)
    from ..runtime.session_create import _clamp_ir_version

    data = _clamp_ir_version(proto.SerializeToString()) if proto.ByteSize() < (2 << 30) - (1 << 20) else None
    target = os.fspath(path)
    written = [target]
    if data is not None:
        with open(target, "wb") as f:
            f.write(data)
    else:
        location = os.path.basename(target) + ".data"
        onnx.save_model(proto, target, save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=1024)
        written.append(os.path.join(os.path.dirname(target), location))
    return {"inputs": [name for _, name in tensor_inputs], "outputs": out_names, "dims": dims, "files": written}


def _fill_initializers(proto: Any, region: _Region, weights: Mapping[str, torch.Tensor], program: ExportedProgram) -> None:
    """Give the model's external initializers their data (the weights they stand for)."""
    from onnx import TensorProto

    by_name = {init["name"]: init["weight"] for init in region.initializers}
    for tensor_proto in proto.graph.initializer:
        if tensor_proto.data_location != TensorProto.EXTERNAL:
            continue
        key = by_name.get(tensor_proto.name)
        tensor = weights.get(key) if key is not None else None
        if tensor is None and key is not None:
            tensor = _state_tensor(program, key)
        if tensor is None:
            raise SaveError(f"initializer {tensor_proto.name} has no weight")
        del tensor_proto.external_data[:]
        tensor_proto.data_location = TensorProto.DEFAULT
        tensor_proto.raw_data = _tensor_bytes(tensor)


def _output_names(spec: pytree.TreeSpec) -> list[str]:
    """One name per output leaf: its key path (``logits``, ``hidden_states_0``), or
    ``output_<i>`` for positions."""
    structure = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    names = []
    for i, (path, _) in enumerate(pytree.tree_flatten_with_path(structure)[0]):
        name = "_".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
        names.append(name if name and not name[0].isdigit() else f"output_{name or i}")
    return names


def _dim_names(dynamic_shapes: Any, args: tuple[Any, ...], kwargs: dict[str, Any], lowered: Lowered) -> dict[str, str]:
    """Symbol (``s0``) -> the name of the ``torch.export.Dim`` given for it, where it can be
    matched to an input's dim."""
    if dynamic_shapes is None:
        return {}
    per_input: list[Any] = []
    if isinstance(dynamic_shapes, Mapping):
        names = [n.name for n in lowered.user_inputs]
        per_input = [dynamic_shapes.get(n) for n in names]
    elif isinstance(dynamic_shapes, (tuple, list)) and len(dynamic_shapes) == len(lowered.user_inputs):
        per_input = list(dynamic_shapes)
    out: dict[str, str] = {}
    for node, spec in zip(lowered.user_inputs, per_input):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or spec is None:
            continue
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        for d, dim in items:
            name = getattr(dim, "__name__", None)
            if name and isinstance(d, int) and d < val.dim() and isinstance(val.shape[d], torch.SymInt):
                out.setdefault(str(val.shape[d].node.expr), name)
    return out


def _sizes_from_shapes(proto: Any, picks: Sequence[Any], in_names: Sequence[str], lowered: Lowered) -> None:
    """Replace the model's integer inputs (sizes: ``{"expr": ...}`` picks over the inputs'
    symbolic dims) by nodes computing them from the tensor inputs' shapes, so the file takes
    tensors only."""
    import ast

    from onnx import TensorProto, helper

    graph = proto.graph
    present = {v.name for v in graph.input}
    where: dict[str, tuple[str, int]] = {}  # symbol -> (input name, dim)
    for node, name in zip(lowered.user_inputs, in_names):
        for d, size in enumerate(node.meta["val"].shape):
            if isinstance(size, torch.SymInt):
                where.setdefault(str(size.node.expr), (name, d))
    made: list[Any] = []
    ops = {ast.Add: "Add", ast.Sub: "Sub", ast.Mult: "Mul", ast.FloorDiv: "Div", ast.Mod: "Mod"}

    def build(expr: ast.AST, out: str) -> str:
        if isinstance(expr, ast.Name):
            source, dim = where[expr.id]
            if source not in present:
                raise SaveError(f"the model reads the size of input {source!r} but not the input itself; it cannot be one ONNX graph")
            made.append(helper.make_node("Shape", [source], [f"{out}_1d"], start=dim, end=dim + 1))
            made.append(helper.make_node("Squeeze", [f"{out}_1d"], [out]))
        elif isinstance(expr, ast.Constant) and type(expr.value) is int:
            made.append(helper.make_node("Constant", [], [out], value=helper.make_tensor(out, TensorProto.INT64, [], [expr.value])))
        elif isinstance(expr, ast.BinOp) and type(expr.op) in ops:
            left, right = build(expr.left, f"{out}_l"), build(expr.right, f"{out}_r")
            made.append(helper.make_node(ops[type(expr.op)], [left, right], [out]))  # sizes: Div of non-negatives floors
        else:
            raise SaveError(f"a size the model computes ({ast.unparse(expr)}) has no ONNX form here")
        return out

    for value, pick in zip(list(graph.input), picks):
        if isinstance(pick, int):
            continue
        build(ast.parse(pick["expr"], mode="eval").body, value.name)
        graph.input.remove(value)
    for node in reversed(made):
        graph.node.insert(0, node)


def _rename(proto: Any, inputs: Mapping[str, str], outputs: list[str], picks: list[int], dims: Mapping[str, str]) -> None:
    """Rename the graph's inputs (old -> new name in ``inputs``) and outputs (and every use),
    and symbolic dims after ``dims``."""
    graph = proto.graph
    taken = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}
    renames: dict[str, str] = dict(inputs)
    for j, value in enumerate(graph.output):
        if picks.count(j) == 1:  # the region output the program returns once
            renames[value.name] = outputs[picks.index(j)]
    clashes = {new for old, new in renames.items() if new in taken and new != old and new not in renames}
    if clashes:  # a name the graph already uses for another value: that value is renamed first
        for node in graph.node:
            for field in (node.input, node.output):
                for i, n in enumerate(field):
                    if n in clashes:
                        field[i] = f"{n}__ort_lazy"
    for node in graph.node:
        for field in (node.input, node.output):
            for i, n in enumerate(field):
                if n in renames:
                    field[i] = renames[n]
    for value in (*graph.input, *graph.output):
        value.name = renames.get(value.name, value.name)
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in dims:
                dim.dim_param = dims[dim.dim_param]

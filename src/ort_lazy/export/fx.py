"""aten FX graph -> ONNX, with the exporter's direct translator (milliseconds, symbolic dims kept).

The numbers kept as eager computes them around the translation (type promotion, exact Python
floats, float64 constants and inputs) are :mod:`~ort_lazy.export.promotion`'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat, metrics
from ..runtime.kernel_fixes import KERNEL_FIXES_FACT, kernel_fixes
from ..runtime.providers import RegionForm, region_form
from ..runtime.quirks import EXACT_SIGMOID_FACT, MATMUL_TRANSPOSES_FACT, exact_sigmoid, fuse_matmul_transposes
from ..runtime.tensorrt import FLOAT16_FACT
from ..specs import TORCH_TO_ONNX, OrtModel, TensorSpec
from . import attention
from .activations import contrib_ops
from .cleanup import clean_up
from .half import float32_products, narrow_to_float16
from .pooling import checked, nan_rule
from .promotion import _double_symbolic_inputs, _exact_double_scalars, _prepare, _restore_double_constants
from .quantize import names_read, quantize_dynamic_int8
from .reductions import leading_sums_as_matmul
from .translations import register_own_translations
from .widen import widen_low_precision

__all__ = ["ExportError", "translate", "export_graph", "single_node_graph", "isolated_nodes_graph", "spec_of", "reinfer_types"]


class ExportError(RuntimeError):
    """The graph could not be translated to ONNX."""


def spec_of(value: Any) -> TensorSpec:
    """The :class:`TensorSpec` of an FX meta value (tensor, or SymInt/int for scalars)."""
    if isinstance(value, torch.Tensor):
        shape = tuple(d if isinstance(d, int) else str(d.node) for d in value.shape)
        return TensorSpec(value.dtype, shape, value.device)
    # Python scalars become 0-d tensors of the type the translated graph reads: floats are
    # float64 (``_double_symbolic_inputs``), so float64 ops read eager's number
    if isinstance(value, (bool, torch.SymBool)):
        return TensorSpec(torch.bool, (), torch.device("cpu"), scalar=True)
    if isinstance(value, (float, torch.SymFloat)):
        return TensorSpec(torch.float64, (), torch.device("cpu"), scalar=True)
    return TensorSpec(torch.int64, (), torch.device("cpu"), scalar=True)


def single_node_graph(node: torch.fx.Node) -> torch.fx.GraphModule:
    """A graph holding just ``node``, its tensor/SymInt inputs turned into placeholders."""
    return isolated_nodes_graph([node], single=True)


def isolated_nodes_graph(nodes: Sequence[torch.fx.Node], single: bool = False) -> torch.fx.GraphModule:
    """A graph holding copies of ``nodes``, each reading its own placeholders (one per distinct
    tensor/SymInt input) and each an output. ``single``: one node, output as is (not a tuple)."""
    graph = torch.fx.Graph()
    outputs = []
    for i, node in enumerate(nodes):
        env: dict[torch.fx.Node, torch.fx.Node] = {}

        def placeholder(n: torch.fx.Node, env: dict[torch.fx.Node, torch.fx.Node] = env, i: int = i) -> torch.fx.Node:
            if n not in env:
                p = graph.placeholder(f"in_{len(env)}" if single else f"n{i}_in_{len(env)}")
                p.meta["val"] = n.meta.get("val", n.meta.get("example_value"))
                env[n] = p
            return env[n]

        new = graph.node_copy(node, placeholder)
        new.meta = dict(node.meta)
        outputs.append(new)
    graph.output(outputs[0] if single else tuple(outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


#: the name prefix of a model's check outputs (:attr:`~ort_lazy.specs.OrtModel.checks`)
CHECK_PREFIX = "ort_lazy_check_"
#: whether models for the CPU provider take checked fast forms (:func:`translate`); off, they
#: hold the exact forms GPU models have (the tests of those forms turn it off)
CHECKED_FORMS_ON_CPU = True


def translate(
    gm: torch.fx.GraphModule, name: str = "region", providers: Sequence[str] | None = None, checks: bool = False
) -> Any:
    """Translate ``gm`` (aten ops, placeholders with ``meta['val']``) to an ``onnx_ir`` model.

    With ``providers``, float16 / bfloat16 nodes those providers have no kernel for are
    computed in float32 between casts, per op (:func:`~ort_lazy.export.widen.widen_low_precision`).
    The model is written in the form every provider of ``providers`` reads
    (:func:`~ort_lazy.runtime.providers.region_form`: no contrib ops or fused ``Attention``
    for providers that read standard ONNX only; :func:`for_providers` finishes the form).
    With ``checks``, translations whose exact form would cost ORT speed on every call for a
    rare input (max pooling's NaN rule, :func:`~ort_lazy.export.pooling.checked`) take the fast
    form and add a boolean output named :data:`CHECK_PREFIX` ``<i>`` after the graph's own
    outputs: set, the call's inputs need PyTorch.
    """
    gm = _prepare(gm, providers)
    scalars = _exact_double_scalars(gm)
    register_own_translations(_compat.onnx_registry())
    form = region_form(tuple(providers) if providers else None)
    with contrib_ops(form.contrib_ops):
        model, flags = _translated(gm, name, providers, checks, fused_attention=form.fused_attention)
    for i, flag in enumerate(flags):
        flag.name = f"{CHECK_PREFIX}{i}"
        model.graph.outputs.append(flag)
    if scalars:
        _bake_constants(model, scalars)
    _double_symbolic_inputs(model, gm)
    _restore_double_constants(model, gm)
    _uncopied_outputs(model)
    _dedupe_outputs(model)
    _compat.finalize_ir_model(model)
    leading_sums_as_matmul(model, providers)
    if providers is not None:
        model = widen_low_precision(model, providers)
    return model


def _translated(
    gm: torch.fx.GraphModule, name: str, providers: Sequence[str] | None, checks: bool, fused_attention: bool
) -> tuple[Any, list[Any]]:
    """``gm`` translated into a new ``onnx_ir`` model, with the check flags its translations
    made (:func:`translate`); attention as ONNX's ``Attention`` where the model can take it
    (:func:`~ort_lazy.export.attention.settle`), else decomposed."""
    with attention.fused(fused_attention):
        model = _compat.new_ir_model(name)
        with checked() if checks else contextlib.nullcontext([]) as flags:
            _compat.translate_fx_graph(gm.graph, model)
        if any(flag.producer() is None or flag.producer().graph is not model.graph for flag in flags):
            model = _compat.new_ir_model(name)  # a flag inside a subgraph: the exact forms instead
            _compat.translate_fx_graph(gm.graph, model)
            flags = []
    _compat.finalize_ir_model(model)
    if fused_attention and not attention.settle(model, providers):
        return _translated(gm, name, providers, checks, fused_attention=False)
    return model, flags


def _uncopied_outputs(model: Any) -> int:
    """Graph outputs that an ``Identity`` copies from a value the graph computes become that
    value (in place; returns how many).

    ``clone`` translates to ``Identity``; a forward region returns such copies as tensors the
    backward saves (the contiguous query, key and value of every attention layer). ORT removes
    an ``Identity`` only when nothing else reads its input, so each of these copied its tensor
    on every call (48 copies, 1.3 ms of ViT-Tiny's 46 ms training forward). Inputs, constants
    and values that are already outputs keep their copy (each output needs its own buffer).
    """
    graph = model.graph
    taken = {id(v) for v in graph.inputs} | {id(v) for v in graph.outputs}
    replaced = 0
    for i, value in enumerate(list(graph.outputs)):
        node = value.producer()
        if node is None or node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
            continue
        source = node.inputs[0]
        if source is None or id(source) in taken or source.const_value is not None:
            continue
        producer = source.producer()
        if producer is None or producer.op_type == "Constant":
            continue
        graph.outputs[i] = source
        value.replace_all_uses_with(source)
        taken.add(id(source))
        graph.remove(node, safe=True)
        replaced += 1
    return replaced


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


_CPU = ("CPUExecutionProvider",)


def export_graph(
    gm: torch.fx.GraphModule,
    name: str = "region",
    constants: dict[int, torch.Tensor] | None = None,
    providers: Sequence[str] | None = None,
    shared: bool = False,
    precision: str = "fp32",
    fast_math: bool = False,
    checked: bool = True,
) -> OrtModel:
    """Translate ``gm`` and package it with its torch-side input/output specs.

    ``constants`` maps placeholder positions to tensors that become initializers (weights);
    those inputs disappear from the ONNX model's inputs. Their values are baked into the model,
    or, with ``shared``, left out: the model declares them (dtype and shape, data "external") and
    the session is given the tensors' own memory (:attr:`OrtModel.external`). ``providers``: the
    execution providers the model is for (see :func:`translate`). ``precision``
    ``int8-dynamic`` quantizes the matrix products of baked weights
    (:func:`~ort_lazy.export.quantize.quantize_dynamic_int8`); ``fp16`` computes them (and the
    ops around them) in float16 where the providers have kernels
    (:func:`~ort_lazy.export.half.narrow_to_float16`). ``fast_math`` (the option of that name)
    keeps ORT's approximate CPU ``Sigmoid`` and translates max pooling without eager's NaN rule.
    A model for the CPU provider has check outputs (:attr:`~ort_lazy.specs.OrtModel.checks`,
    :func:`translate`) unless ``checked`` is False; one for a GPU none (reading a flag would
    wait for the GPU).

    Raises:
        ExportError: the translator failed (the message names the node), or ONNX shape
            inference disagrees with the graph's own shapes/dtypes (a wrong translation).
    """
    import onnx_ir as ir

    start = time.perf_counter()
    constants = constants or {}
    try:
        form = region_form(tuple(providers) if providers else None)
        with nan_rule(not fast_math):
            # check flags are read after each run: free where the outputs are host memory
            model = translate(gm, name, providers, checks=checked and CHECKED_FORMS_ON_CPU and form.host_outputs)
        fused = sum(1 for node in model.graph.all_nodes() if node.op_type == "Attention" and node.domain == "")
        if fused:
            metrics.increment("fused_attention", fused)
        external: dict[str, int] = {}
        narrowed = 0
        if constants:
            external = _bake_constants(model, constants, shared)
            if precision == "fp16" and not shared:
                narrowed = narrow_to_float16(model, providers or _CPU)
                if not narrowed and float32_products(model):
                    metrics.warn_once(
                        "fp16_unavailable",
                        "ort-lazy: precision='fp16': no float16 kernel for the matrix products of %s on %s; "
                        "it runs in float32",
                        name, ", ".join(providers or _CPU),
                    )
        clean_up(model)
        # the clean-up may leave an output copied by an Identity (cancelling transposes) or
        # folded to a constant
        _uncopied_outputs(model)
        _dedupe_outputs(model)
        proto = ir.serde.serialize_model(model)
        _drop_unused_optional_outputs(proto)
        if precision == "int8-dynamic" and constants and not shared:
            proto = quantize_dynamic_int8(proto)
        proto = for_providers(proto, form)
    except Exception as e:
        raise ExportError(f"{name}: {e}") from e
    placeholders = [n for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder") if i not in constants]
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    out_args = output_node.args[0]
    out_nodes = list(out_args) if isinstance(out_args, (tuple, list)) else [out_args]
    in_specs = [spec_of(p.meta.get("val")) for p in placeholders]
    out_specs = [spec_of(n.meta.get("val") if isinstance(n, torch.fx.Node) else n) for n in out_nodes]
    checks = sum(o.name.startswith(CHECK_PREFIX) for o in proto.graph.output)
    out_specs += [TensorSpec(torch.bool, (), torch.device("cpu"))] * checks
    values = {
        n.name: spec_of(n.meta["val"])
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    _check_inferred_types(proto, out_specs, name, values)
    model_bytes = proto.SerializeToString()
    facts: dict[str, Any] = {}
    try:  # the installed onnxruntime's kernel bugs, for these providers
        model_bytes = kernel_fixes(model_bytes, providers or _CPU)
    except Exception as e:
        raise ExportError(f"{name}: {e}") from e
    facts[KERNEL_FIXES_FACT] = True
    if narrowed:
        facts[FLOAT16_FACT] = True  # TensorRT may build float16 engines of it
    if (providers or _CPU)[0] == _CPU[0]:
        # ORT's CPU Sigmoid is an approximation, its transposed products slow: rewritten once
        # here, not at each session (nor in a warm process, which would have to parse the model)
        try:
            if not fast_math:
                model_bytes = exact_sigmoid(model_bytes, providers or _CPU)
                facts[EXACT_SIGMOID_FACT] = True
            model_bytes, facts[MATMUL_TRANSPOSES_FACT] = fuse_matmul_transposes(model_bytes, providers or _CPU)
        except Exception as e:
            raise ExportError(f"{name}: {e}") from e
    result = OrtModel(
        model_bytes=model_bytes,
        input_names=[i.name for i in proto.graph.input],
        output_names=[o.name for o in proto.graph.output],
        input_specs=in_specs,
        output_specs=out_specs,
        name=name,
        external=external,
        facts=facts,
        checks=checks,
    )
    if len(result.input_names) != len(placeholders) or len(result.output_names) != len(out_nodes) + checks:
        raise ExportError(
            f"{name}: ONNX model has {len(result.input_names)} inputs / {len(result.output_names)} "
            f"outputs, graph has {len(placeholders)} / {len(out_nodes)}"
        )
    metrics.record_time("export", time.perf_counter() - start)
    return result


#: optional trailing outputs that cost ORT work even when nothing reads them
#: (MaxPool's Indices make ORT take its generic kernel: 4.1 vs 0.3 ms on 16x16x64x64)
_OPTIONAL_OUTPUTS = {("", "MaxPool"): 1}


def for_providers(proto: Any, form: RegionForm) -> Any:
    """``proto`` in ``form`` (:class:`~ort_lazy.runtime.providers.RegionForm`): local functions
    inlined, the default domain's opset within the providers' bound, and every value typed
    (element type and shape in ``value_info``, the translator's own annotations kept, ONNX's
    inference for the rest). Unchanged for ORT's own kernel providers.

    Raises:
        ExportError: the model needs a newer opset than the providers read, or a value's type
            cannot be inferred.
    """
    import onnx
    import onnx.inliner

    if form.own:
        return proto
    if form.inline_functions and len(proto.functions):
        proto = onnx.inliner.inline_local_functions(proto)
        del proto.functions[:]
        used = {n.domain for n in _all_nodes(proto.graph)}
        keep = [o for o in proto.opset_import if o.domain in ("", "ai.onnx") or o.domain in used]
        del proto.opset_import[:]
        proto.opset_import.extend(keep)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if form.max_opset is not None and opset is not None and opset > form.max_opset:
        raise ExportError(
            f"{proto.graph.name}: the model needs ONNX opset {opset}, the providers read up to {form.max_opset}"
        )
    if form.typed_values:
        proto = _typed_values(proto)
    return proto


def _all_nodes(graph: Any) -> Any:
    """Every node of ``graph`` and of its subgraphs (``If``/``Loop``/``Scan`` bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def _typed_values(proto: Any) -> Any:
    """``proto`` with an element type and a shape in ``value_info`` for every value its nodes
    make (the translator's annotations kept; ONNX's inference for the others, and for the
    values of subgraphs: ``If`` branches and their outputs)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    found = {v.name: v for v in inferred.graph.value_info}
    outputs = {o.name for o in proto.graph.output}
    kept = []
    for v in proto.graph.value_info:
        better = found.pop(v.name, None)
        complete = v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape")
        kept.append(v if complete or better is None else better)
    kept += [v for name, v in found.items() if name not in outputs]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    # branches and loop bodies as ONNX typed them (their outputs included)
    for node, typed_node in zip(proto.graph.node, inferred.graph.node):
        for attr, typed_attr in zip(node.attribute, typed_node.attribute):
            if attr.HasField("g"):
                attr.g.CopyFrom(typed_attr.g)
    typed = {
        v.name for v in proto.graph.value_info if v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape")
    } | {o.name for o in proto.graph.output}
    untyped = [out for node in proto.graph.node for out in node.output if out and out not in typed]
    if untyped:
        raise ExportError(f"{proto.graph.name}: no type or rank can be inferred for {untyped[:3]}")
    return proto


def _drop_unused_optional_outputs(proto: Any) -> None:
    """Remove optional node outputs nothing reads (in place), so ORT can skip computing them."""
    used = names_read(proto.graph)
    dropped = set()
    for node in proto.graph.node:
        first = _OPTIONAL_OUTPUTS.get((node.domain, node.op_type))
        if first is None:
            continue
        while len(node.output) > first and node.output[-1] not in used:
            dropped.add(node.output[-1])
            del node.output[-1]
    if dropped:
        keep = [v for v in proto.graph.value_info if v.name not in dropped]
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(keep)


def _bake_constants(model: Any, constants: dict[int, torch.Tensor], shared: bool = False) -> dict[str, int]:
    """Turn the graph inputs at ``constants``' positions into initializers holding the tensors
    (with ``shared``: declaring them only, their data external); returns {name: position} of
    the shared ones."""
    import onnx_ir as ir

    inputs = list(model.graph.inputs)
    keep = []
    external: dict[str, int] = {}
    for i, value in enumerate(inputs):
        if i in constants and shared:
            tensor = constants[i]
            # from the dtype alone: no tensor is made here (export may run inside a fake mode)
            dtype = ir.DataType(TORCH_TO_ONNX[tensor.dtype])
            value.const_value = ir.ExternalTensor(
                f"ort-lazy-shared-{i}", offset=None, length=None, dtype=dtype, shape=ir.Shape(tuple(tensor.shape)), name=value.name
            )
            model.graph.initializers[value.name] = value
            external[value.name] = i
        elif i in constants:
            with _compat.real_tensor_mode():
                tensor = constants[i].detach().cpu().contiguous()
                if tensor.dtype == torch.bfloat16:
                    array, dtype = tensor.view(torch.uint16).numpy().copy(), ir.DataType.BFLOAT16
                else:
                    array, dtype = tensor.numpy().copy(), None
            value.const_value = ir.Tensor(array, dtype=dtype, name=value.name)
            model.graph.initializers[value.name] = value
        else:
            keep.append(value)
    model.graph.inputs.clear()
    model.graph.inputs.extend(keep)
    return external


def _check_inferred_types(
    proto: Any, out_specs: list[TensorSpec], name: str, values: dict[str, TensorSpec] | None = None
) -> None:
    """Fail when ONNX's own inference contradicts the shapes/dtypes the graph declares.

    The translator annotates values with torch's shapes, which would hide a translation that
    computes something else (a wrongly shaped auxiliary output, another dtype). So the
    annotations are dropped, ONNX infers the values afresh, and every known dim and dtype must
    agree with the FX metadata; otherwise the region falls back instead of being wrong. Checked
    for the outputs, and the shapes of the values ``values`` names (the FX nodes of the graph,
    whose results the translator names after them): a wrongly shaped value inside the region is
    as wrong as an output, and a reduction after it can hide its shape (``copy`` translated
    without its broadcast summed the source alone). Their types may differ on purpose (float16
    ops computed in float32 between casts, ``precision="fp16"``).
    """
    import onnx

    try:
        inferred = reinfer_types(proto)
    except onnx.shape_inference.InferenceError as e:
        raise ExportError(f"{name}: ONNX inference rejects the model: {str(e).splitlines()[0]}") from e
    for out, spec in zip(inferred.graph.output, out_specs):
        _check_value(out, spec, name, "output")
    for info in inferred.graph.value_info:
        spec = (values or {}).get(info.name)
        if spec is not None:
            _check_value(info, spec, name, "value", types=False)


def _check_value(info: Any, spec: TensorSpec, name: str, kind: str, types: bool = True) -> None:
    ttype = info.type.tensor_type
    if types and ttype.elem_type and spec.dtype in TORCH_TO_ONNX and ttype.elem_type != TORCH_TO_ONNX[spec.dtype]:
        raise ExportError(f"{name}: {kind} {info.name} is ONNX type {ttype.elem_type}, the graph says {spec.dtype}")
    if not ttype.HasField("shape"):
        return
    dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
    if len(dims) != len(spec.shape) or any(d is not None and isinstance(e, int) and d != e for d, e in zip(dims, spec.shape)):
        raise ExportError(
            f"{name}: {kind} {info.name} has inferred shape {[d if d is not None else '?' for d in dims]}, "
            f"the graph says {list(spec.shape)} (wrong translation)"
        )


def reinfer_types(proto: Any, inline: bool = False) -> Any:
    """ONNX's own types and shapes for ``proto``, ignoring the ones the translator declared.

    The translator annotates values with torch's shapes, which would hide a translation that
    computes something else; so intermediate annotations are dropped and output shapes cleared
    before strict inference (types checked). ``inline``: inline local functions first, whose
    bodies carry no types (a node inside one is only checked after inlining). ``proto`` is not
    modified.

    Raises:
        onnx.shape_inference.InferenceError: the model is ill-typed.
    """
    import onnx
    import onnx.inliner

    probe = onnx.inliner.inline_local_functions(proto) if inline else onnx.ModelProto()
    if not inline:
        probe.CopyFrom(proto)
    del probe.graph.value_info[:]
    for out in probe.graph.output:
        out.type.tensor_type.ClearField("shape")
    return onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True, data_prop=True)

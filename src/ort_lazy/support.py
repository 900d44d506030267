"""Which aten op, with which dtypes, ORT can run on which execution provider.

One table serves every front door: an op is supported when the exporter has an ONNX
translation for its overload AND every ONNX node that translation emits for the op's actual
dtypes has a kernel on the chosen providers (ORT's kernel registry). The dtype half is decided
by translating the single op once per (overload, dtypes, arguments, providers) and checking the
emitted nodes, so e.g. bfloat16 ``Mul`` on CPU falls back up front instead of failing at session
creation.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from . import _compat
from .export.attention import not_fusable
from .export.strided import layout_problem
from .opnames import lookup, named_in, op_name
from .options import Options
from .reasons import Reason

__all__ = [
    "Reason",
    "DISTRUSTED",
    "DISTRUSTED_WHEN",
    "bound_arguments",
    "registered_ops",
    "translatable",
    "unsupported_reason",
    "excluded_reason",
    "mark_runtime_weights",
    "PREFERRED_WHEN",
    "RUNTIME_WEIGHT",
    "CONV_MIN_FLOPS",
    "probe_op",
    "probe_ops",
    "probe_error",
    "op_reason",
    "torchscript_reason",
    "static_reason",
    "graph_reasons",
    "save_support_table",
    "NEEDS_PROBE",
]


# dtypes ONNX/ORT can carry at all across the boundary.
_CARRIED = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}

# Ops that only shuffle metadata or are pure Python plumbing, always kept with their producer.
_GETITEM = operator.getitem

#: Devices an ORT execution provider can read tensors from.
_DEVICES = ("cpu", "cuda")


def _distrusted() -> dict[Any, str]:
    aten = torch.ops.aten
    return {
        # ORT's BatchNormalization(training_mode=1) neither matches torch's running-variance
        # update (unbiased) nor returns the saved mean / inverse std torch's backward needs.
        aten._native_batch_norm_legit_functional.default: "training batch norm translation is wrong",
        aten._native_batch_norm_legit.default: "training batch norm translation is wrong",
        aten.native_batch_norm.default: "training batch norm translation is wrong",
        # torchlib fakes total_weight = 1: mean-reduced gradients come out batch-size times too
        # large while the loss is right (torch's decomposition computes it)
        aten.nll_loss_forward.default: "total_weight output is always 1",
        aten.nll_loss2d_forward.default: "total_weight output is always 1",
        # exp(x^2) * erfc(x) overflows and cancels (NaN/inf from x ~ 9, wrong well before)
        aten.special_erfcx.default: "naive formula, inaccurate and overflowing",
        # subtracts the whole axis' maximum, not a running one: entries far below a later
        # maximum underflow to -inf ([-65504, 2] gives -inf where eager gives -65504)
        aten.logcumsumexp.default: "underflows below a later maximum of the axis",
        # clamps by eps with a comparison NaN fails: logit(NaN, eps) gave logit(1 - eps)
        aten.logit.default: "clamps NaN to 1 - eps (eager: NaN)",
    }


#: Overloads the exporter translates, but wrongly (reason as value). They are decomposed
#: into smaller aten ops before partitioning (see :mod:`ort_lazy.lowering.decompositions`); one
#: that still reaches the partitioner stays in PyTorch.
DISTRUSTED: dict[Any, str] = _distrusted()


def _when(name: str, wrong: Callable[[Any], bool], reason: str) -> Callable[[dict[str, Any]], str | None]:
    return lambda arguments: reason if wrong(arguments.get(name)) else None


def _low_precision(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def _attention(arguments: dict[str, Any]) -> str | None:
    why = not_fusable(
        arguments.get("query"), arguments.get("key"), arguments.get("value"),
        arguments.get("dropout_p") or 0.0, bool(arguments.get("is_causal")), arguments.get("attn_mask"),
    )
    return None if why is None else f"attention translated for float32 without dropout only ({why})"


def _integral(value: Any) -> bool:
    """An integer or bool tensor or number."""
    if isinstance(value, torch.Tensor):
        return not (value.dtype.is_floating_point or value.dtype.is_complex)
    return isinstance(value, int)


def _integer_power(arguments: dict[str, Any]) -> str | None:
    """ORT computes integer ``Pow`` through floating point: results past 2**53 lose their low
    digits, overflows do not wrap as PyTorch's do, and 0 to a negative power is the type's
    minimum instead of 0. A constant exponent is decomposed into products
    (:func:`~ort_lazy.lowering.arithmetic.integer_power`)."""
    if _integral(arguments.get("self")) and _integral(arguments.get("exponent")):
        return "integer powers are computed in floating point"
    return None


def _empty_mean(arguments: dict[str, Any]) -> str | None:
    """A mean over no elements is NaN in PyTorch; ORT's ``ReduceMean`` (and the translations
    of variances and mean-reduced losses built on it) gives 0 there. Sizes of 0 are static
    (dynamo specialises them), so the node is known empty when it is compiled."""
    value = next((arguments[k] for k in ("self", "input", "inp") if k in arguments), None)
    if isinstance(value, torch.Tensor) and _compat.static_int(value.numel()) == 0:
        return "a mean over no elements is NaN, ORT's gives 0"
    return None


def _variance(arguments: dict[str, Any]) -> str | None:
    """``prims.var`` (every variance and standard deviation lowers to it): besides the empty
    mean, its translation divides by ``N - correction`` where PyTorch divides by
    ``max(0, N - correction)``: a correction past the count gave a negative variance (a NaN
    deviation) where eager's is infinite. A symbolic count is trusted for corrections of 0 and 1."""
    empty = _empty_mean(arguments)
    if empty is not None:
        return empty
    value, dims, correction = arguments.get("inp"), arguments.get("dims"), arguments.get("correction")
    if not isinstance(value, torch.Tensor) or not isinstance(correction, (int, float)):
        return None
    size: Any = 1
    for d in range(value.dim()) if not dims else dims:
        size = size * value.shape[d]
    count = _compat.static_int(size)
    if count is not None and correction <= count or count is None and correction <= 1:
        return None
    return "a correction past the count: the translation divides by a negative count"


def _antialiased_resampling(arguments: dict[str, Any]) -> str | None:
    """Antialiased bilinear / bicubic resampling: ORT's antialiased ``Resize`` places
    ``align_corners=True`` samples elsewhere, and its translation resamples by the ratio of the
    sizes where eager uses the scale it is given (``scale_factor=0.75`` of 10 rows: 7 rows
    sampled 1/0.75 apart, not 10/7): 0.4-2.4 off eager."""
    if arguments.get("align_corners"):
        return "antialiased align_corners=True is placed differently by ORT"
    x = arguments.get("self", arguments.get("input"))
    scales = arguments.get("scale_factors") or [arguments.get("scales_h"), arguments.get("scales_w")]
    sizes = arguments.get("output_size")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return None
    for i, (size, scale) in enumerate(zip(x.shape[-2:], scales)):
        if scale is None:
            continue
        out = sizes[i] if sizes else math.floor(size * scale)
        if not isinstance(size, int) or not isinstance(out, int) or out != size * scale:
            return "antialiased resampling by a scale other than the sizes' ratio"
    return None


def _distrusted_when() -> dict[Any, Callable[[dict[str, Any]], str | None]]:
    aten = torch.ops.aten
    means = [
        aten.mean.default, aten.mean.dim, aten.var.default, aten.var.dim, aten.var.correction,
        aten.std.default, aten.std.dim, aten.std.correction, aten.var_mean.default, aten.var_mean.dim,
        aten.var_mean.correction, aten.std_mean.default, aten.std_mean.dim, aten.std_mean.correction,
        aten.mse_loss.default, aten.l1_loss.default, aten.smooth_l1_loss.default, aten.huber_loss.default,
        aten.soft_margin_loss.default, aten.binary_cross_entropy.default,
        aten.binary_cross_entropy_with_logits.default, aten.kl_div.default,
    ]
    ignored_divisor = _when("divisor_override", lambda v: v is not None, "divisor_override is ignored by the translation")
    return {
        **dict.fromkeys(means, _empty_mean),
        torch.ops.prims.var.default: _variance,
        aten.avg_pool2d.default: ignored_divisor,
        aten.avg_pool3d.default: ignored_divisor,
        **dict.fromkeys(
            [
                aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa.vec,
                aten._upsample_bicubic2d_aa.default, aten._upsample_bicubic2d_aa.vec,
            ],
            _antialiased_resampling,
        ),
        aten.pow.Tensor_Tensor: _integer_power,
        aten.pow.Tensor_Scalar: _integer_power,
        aten.pow.Scalar: _integer_power,
        aten.scatter_reduce.two: _when("reduce", lambda v: v == "mean", "reduce='mean' translation is wrong"),
        # ORT's GridSample interpolates differently in float16 / bfloat16 (2e-2 / 0.16 off eager)
        aten.grid_sampler_2d.default: _when("input", _low_precision, "float16/bfloat16 interpolation differs from eager"),
        # ort-lazy's translation (ONNX Attention) covers what the lowering keeps whole; the
        # library's returns a wrongly shaped logsumexp
        aten._scaled_dot_product_flash_attention_for_cpu.default: _attention,
        # addressing memory: right only where the input's row-major order is its storage order
        aten.as_strided.default: layout_problem,
        aten.as_strided_scatter.default: functools.partial(layout_problem, scatter=True),
        torch.ops.prims.as_strided_scatter.default: functools.partial(layout_problem, scatter=True),
    }


#: Overloads whose translation is wrong for some arguments only: op -> check(bound arguments)
#: returning the reason, or None where the translation is right.
DISTRUSTED_WHEN: dict[Any, Callable[[dict[str, Any]], str | None]] = _distrusted_when()


#: ``node.meta`` key :func:`mark_runtime_weights` sets on a convolution: True where its weight
#: reaches ORT as a graph input on the CPU (training graphs, inference without
#: ``prepack_weights``) and the convolution does at least :data:`CONV_MIN_FLOPS`
RUNTIME_WEIGHT = "ort_lazy_runtime_weight"

#: floating-point operations per call from which a CPU convolution with a run-time weight is
#: left to PyTorch's oneDNN kernel: smaller ones cost less on ORT than the region boundary
#: PyTorch's would add (MobileNetV3-small, convolutions of 0-14 MFLOP, median 0.9: its training
#: step 1.36x eager with them on ORT, 1.54-1.56x with every one in PyTorch, 1.38-1.40x with this
#: limit; ConvNeXt-atto's 0.8-8 MFLOP ones: 1.95-2.09x in all three forms, noise; ResNet-18's,
#: 26-472 MFLOP: 1.08x in PyTorch against 1.22x on ORT)
CONV_MIN_FLOPS = 4_000_000


def _convolution_flops(node: torch.fx.Node) -> float:
    """Multiply-adds times two of a call of ``aten.convolution`` (infinity when a shape is symbolic:
    never treated as small)."""
    x, weight, out = _meta(node.args[0]), _meta(node.args[1]), _meta(node)
    if not all(isinstance(t, torch.Tensor) for t in (x, weight, out)):
        return 0.0
    transposed = len(node.args) > 6 and bool(node.args[6])
    # each output element (each input element when transposed) meets one weight slice
    per_element, elements = weight[0].numel(), (x if transposed else out).numel()
    if not isinstance(per_element, int) or not isinstance(elements, int):
        return float("inf")
    return 2.0 * elements * per_element


def mark_runtime_weights(gm: torch.fx.GraphModule, constants: dict[int, Any] | None = None) -> None:
    """Set :data:`RUNTIME_WEIGHT` on every convolution of ``gm``: True where its weight is, or
    is computed from, a graph input that regions do not bind as an initializer, and the call
    does at least :data:`CONV_MIN_FLOPS`; ``constants`` are the positions of the placeholders
    they bind (``compile_graph``'s). A weight built from constants alone (a rewrite's kernel of
    ones) is folded by ORT: not marked."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bound = {placeholders[i] for i in (constants or {}) if i < len(placeholders)}
    runtime: dict[torch.fx.Node, bool] = {}
    for node in gm.graph.nodes:  # topological: inputs are decided first
        if node.op == "placeholder":
            runtime[node] = node not in bound
        else:
            runtime[node] = any(runtime.get(i, False) for i in node.all_input_nodes)
        if node.op == "call_function" and node.target is torch.ops.aten.convolution.default:
            weight = node.args[1] if len(node.args) > 1 else None
            value = _meta(weight)
            node.meta[RUNTIME_WEIGHT] = (
                isinstance(weight, torch.fx.Node)
                and runtime.get(weight, False)
                and isinstance(value, torch.Tensor)
                and value.device.type == "cpu"
                and _convolution_flops(node) >= CONV_MIN_FLOPS
            )


def _preferred_when() -> dict[Any, Callable[[torch.fx.Node], bool]]:
    from .export.selects import LARGE_SELECT

    def large(node: torch.fx.Node) -> bool:
        out = _meta(node)
        return isinstance(out, torch.Tensor) and (_compat.static_int(out.numel()) or 0) > LARGE_SELECT

    def runtime_weight(node: torch.fx.Node) -> bool:
        return bool(node.meta.get(RUNTIME_WEIGHT, False))

    return {torch.ops.aten.threshold_backward.default: large, torch.ops.aten.convolution.default: runtime_weight}


#: ``torch_preferred_ops`` entries PyTorch runs faster only for some calls: op -> check(node),
#: True where the node stays in PyTorch (named in ``torch_preferred_ops``, the others go to ORT).
PREFERRED_WHEN: dict[Any, Callable[[torch.fx.Node], bool]] = _preferred_when()


def bound_arguments(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument of a call of ``target`` by schema name (defaults filled in)."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(target._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


@functools.lru_cache(maxsize=8)
def registered_ops(cache_dir: str | None = None) -> frozenset[Any]:
    """aten overloads the exporter has a translation for (trusted or not).

    Building the exporter's registry costs seconds per process; with a compile cache directory
    the list is read from there, so a warm process never builds it unless it has to export.
    """
    from .runtime.disk_cache import disk_cache

    cache = disk_cache(cache_dir)
    names = cache.get_json("registered-ops") if cache is not None else None
    if not isinstance(names, list):
        names = sorted({op_name(op) for op in _compat.onnx_implemented_overloads()})
        if cache is not None:
            cache.put_json("registered-ops", names)
    from .export.translations import OWN_TRANSLATIONS

    ops = {op for op in (lookup(n) for n in names) if isinstance(op, torch._ops.OpOverload)}
    return frozenset(ops | set(OWN_TRANSLATIONS))


def translatable(target: Any, cache_dir: str | None = None) -> bool:
    """Whether the exporter translates the overload ``target`` and the translation is trusted."""
    return target not in DISTRUSTED and target in registered_ops(cache_dir)


def excluded_reason(target: Any, options: Options, node: torch.fx.Node | None = None) -> str | None:
    """Why ``target`` stays in PyTorch whatever ORT can do (``torch_executed_ops``, then
    ``torch_preferred_ops``), None when nothing keeps it there. An op of :data:`PREFERRED_WHEN`
    is preferred in PyTorch only where its check passes on ``node`` (never without one)."""
    if named_in(target, options.torch_executed_ops):
        return Reason.EXCLUDED
    if named_in(target, options.torch_preferred_ops):
        when = PREFERRED_WHEN.get(target)
        if when is None or (node is not None and when(node)):
            return Reason.PREFERRED
    return None


def _meta(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return value.meta.get("val", value.meta.get("example_value"))
    return value


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


#: TorchScript ops whose result depends on their input's memory layout, which a TorchScript
#: graph does not carry: they stay in PyTorch (:mod:`ort_lazy.export.strided`); the bridge's
#: fusion pass leaves a graph holding one unfused, whole
MEMORY_ADDRESSING = {
    op: "addresses its input's memory, whose layout a TorchScript graph does not give"
    for op in ("aten::as_strided", "aten::as_strided_scatter")
}


def distrust_reason(target: Any, arguments: Callable[[], dict[str, Any]]) -> str | None:
    """Why ``target``'s translation is distrusted (:data:`DISTRUSTED`, or :data:`DISTRUSTED_WHEN`
    for the bound ``arguments()``, asked only when a check needs them), or None."""
    if target in DISTRUSTED:
        return f"{Reason.DISTRUSTED} ({DISTRUSTED[target]})"
    check = DISTRUSTED_WHEN.get(target)
    why = check(arguments()) if check is not None else None
    return None if why is None else f"{Reason.DISTRUSTED} ({why})"


def _descriptor_value(desc: Any) -> Any:
    """A TorchScript input descriptor as an argument: a tensor as a meta tensor of its dtype and
    known sizes, a constant as itself."""
    if desc[0] != "tensor":
        return desc[1]
    sizes = desc[2] if isinstance(desc[2], (list, tuple)) else [1] * (desc[2] or 0)
    return torch.empty(list(sizes), dtype=desc[1], device="meta")


def _distrusted_reason(target: Any, inputs: Sequence[Any]) -> str | None:
    """:func:`distrust_reason` for a TorchScript node, its inputs given as descriptors."""
    try:
        return distrust_reason(target, lambda: bound_arguments(target, [_descriptor_value(d) for d in inputs], {}))
    except Exception:  # a descriptor the check cannot read: the probe decides
        return None


#: c10's ScalarType codes (how a TorchScript graph passes a ``dtype=`` argument)
_SCALAR_TYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
    6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}
#: TorchScript ops whose translation holds their float arguments (``alpha``, ``beta``, ``eps``)
#: in ONNX float attributes (Gemm, BatchNormalization, LayerNormalization): float32
_FLOAT_ATTRIBUTE_OPS = frozenset({
    "aten::addmm", "aten::batch_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_no_training", "aten::layer_norm", "aten::native_layer_norm",
    "aten::instance_norm", "aten::group_norm", "aten::native_group_norm",
})


def float32_exact(value: float) -> bool:
    """Whether a Python float survives a round trip through float32."""
    try:
        return math.isnan(value) or struct.unpack("f", struct.pack("f", value))[0] == value
    except OverflowError:  # beyond float32's range
        return False


#: ``softplus``'s default threshold
_SOFTPLUS_THRESHOLD = 20


def _correction_problem(inputs: Sequence[Any]) -> str | None:
    """Why the TorchScript exporter's variance (``var``/``std``[``_mean``], given as
    ``(self, unbiased)``, ``(self, dim, unbiased, keepdim)`` or ``(self, dim, correction,
    keepdim)``) is wrong: it divides by ``N - correction`` with the correction made an integer,
    where eager divides by ``max(0, N - correction)`` (``prims.var``'s check on the FX side)."""
    if inputs[0][0] != "tensor" or len(inputs) < 2:
        return None
    dims, given = (None, inputs[1]) if len(inputs) == 2 else (inputs[1], inputs[2])
    if given[0] != "const" or (dims is not None and dims[0] != "const"):
        return None
    if not isinstance(given[1], (int, float, type(None))):
        return None
    correction = 1.0 if given[1] is None else float(given[1])
    if not math.isfinite(correction) or correction != int(correction):
        return f"a correction that is not a whole number ({correction}) is truncated"
    sizes = inputs[0][2]
    if not isinstance(sizes, (list, tuple)) or not all(isinstance(n, int) for n in sizes):
        return None if correction <= 1 else f"correction={correction:g} may pass the element count"
    axes = dims[1] if dims is not None else None
    axes = [axes] if isinstance(axes, int) else axes
    count = math.prod(sizes[a % len(sizes)] for a in axes) if axes else math.prod(sizes)
    if correction > count:
        return f"correction={correction:g} passes the element count ({count}): eager divides by 0, not a negative number"
    return None


def _torchscript_distrusted(op: str, inputs: Sequence[Any]) -> str | None:
    """Why the TorchScript exporter's translation of this node is wrong for these inputs (each
    ``("tensor", dtype, ...)`` or ``("const", value)``), or None."""
    floats = any(d[0] == "tensor" and d[1].is_floating_point for d in inputs[:2])
    mode = next((d[1] for d in inputs[2:] if d[0] == "const" and isinstance(d[1], str)), None)
    if op in ("aten::remainder", "aten::remainder_") and floats:
        return "an infinite divisor gives NaN where eager gives the dividend or an infinity"
    if op == "aten::log2" and any(d[0] == "tensor" and d[1] == torch.float64 for d in inputs):
        return "float64 divided by ln 2 rounded to float32"
    if op in ("aten::softmax", "aten::log_softmax") and len(inputs) > 2 and inputs[2][0] == "const":
        wanted = _SCALAR_TYPES.get(inputs[2][1]) if isinstance(inputs[2][1], int) else inputs[2][1]
        if wanted is not None and inputs[0][0] == "tensor" and wanted != inputs[0][1]:
            # eager converts first; the exporter computes in the input's type and casts the result
            return f"dtype={wanted} converts the result of a {inputs[0][1]} softmax, not its input"
    if (op == "aten::softplus" and len(inputs) > 2 and inputs[2][0] == "const"
            and isinstance(inputs[2][1], (int, float)) and inputs[2][1] < _SOFTPLUS_THRESHOLD):
        # eager returns x where beta * x > threshold; the exporter's Softplus ignores it (at the
        # default of 20 the two differ by exp(-20) / beta at most)
        return f"threshold={inputs[2][1]} is ignored (eager returns x above it)"
    if op in ("aten::var", "aten::std", "aten::var_mean", "aten::std_mean"):
        why = _correction_problem(inputs)
        if why is not None:
            return why
    if any(d[0] == "tensor" and d[1] == torch.float64 for d in inputs):
        if op == "aten::hardswish":
            return "float64 computed with float32 constants"
        inexact = next((d[1] for d in inputs if d[0] == "const" and isinstance(d[1], float) and not float32_exact(d[1])), None)
        if op in _FLOAT_ATTRIBUTE_OPS and inexact is not None:
            return f"a float64 computation reads {inexact} rounded to float32 (an ONNX float attribute)"
    if op in ("aten::div", "aten::div_") and floats and mode in ("trunc", "floor"):
        # trunc: a cast through int64 (wrong beyond its range, for infinities and NaN);
        # floor: infinity where eager's kernel gives NaN
        return f"rounding_mode={mode!r} of floating-point values is wrong beyond int64's range or for infinities"
    return None


def torchscript_reason(op: str, overload: str, inputs: Sequence[Any], options: Options, graph: Any) -> str | None:
    """Whether ORT can run a TorchScript node of a bridge group (None) or why not.

    Groups are exported with the TorchScript exporter, so that exporter decides the mapping:
    ``graph`` (the node alone, made by the bridge) is exported once per signature and every
    emitted ONNX node is checked against ORT's kernels, as the FX probes do for torchlib.
    ``op`` is TorchScript's name (``aten::mul``); each input is ``("tensor", dtype, sizes or
    rank, device or None)`` or ``("const", value)``. Answers are memoised like the FX probes'.
    """
    target = lookup(f"{op}.{overload or 'default'}")
    if isinstance(target, torch._ops.OpOverload):
        excluded = excluded_reason(target, options) or _distrusted_reason(target, inputs)
        if excluded is not None:
            return excluded
    if op in MEMORY_ADDRESSING:
        return f"{Reason.DISTRUSTED} ({MEMORY_ADDRESSING[op]})"
    wrong = _torchscript_distrusted(op, inputs)
    if wrong is not None:
        return f"{Reason.DISTRUSTED} ({wrong})"
    tensors = [d for d in inputs if d[0] == "tensor"]
    device = next((torch.device(d[3]) for d in tensors if d[3] is not None), None)
    if device is not None and device.type not in _DEVICES:
        return Reason.UNSUPPORTED_DEVICE
    if any(d[1] not in _CARRIED for d in tensors):
        return Reason.UNSUPPORTED_DTYPE
    if any(not isinstance(d[2], int) and 0 in d[2] for d in tensors):
        # and the TorchScript exporter's shape inference divides by zero (SIGFPE) reshaping one
        return Reason.EMPTY
    providers = tuple(options.resolve_providers(device))

    def sig(desc: Sequence[Any]) -> Any:
        if desc[0] == "tensor":
            return ["T", str(desc[1]), desc[2]]
        return ["C", repr(desc[1])]

    key = json.dumps(["torchscript", op, overload, [sig(d) for d in inputs], providers])
    table = _probe_table(options.cache_dir)
    with _probe_lock:
        if key in table:
            return table[key]
    answer = _probe_torchscript(graph, tensors, providers)
    with _probe_lock:
        if len(table) > 8192:
            table.clear()
        table[key] = answer
        _dirty.add(options.cache_dir)
    return answer


def _probe_torchscript(graph: Any, tensors: Sequence[Any], providers: tuple[str, ...]) -> str | None:
    """Export the one-node ``graph`` with the TorchScript exporter and check ORT's kernels."""
    import onnx
    import onnx_ir as ir

    from .export.torchscript import export_torchscript
    from .runtime.bridge import no_fusion

    generator = torch.Generator().manual_seed(0)
    examples = []
    for _, dtype, sizes, device in tensors:
        shape = [2] * sizes if isinstance(sizes, int) else list(sizes)
        if dtype.is_floating_point:
            t = torch.rand(shape, generator=generator).to(dtype)
        else:
            t = torch.zeros(shape, dtype=dtype)
        examples.append(t.to(device) if device is not None else t)
    try:
        model = export_torchscript(graph, examples, name="probe", no_fusion=no_fusion)
    except Exception as e:
        return f"{Reason.NO_MAPPING} (TorchScript exporter: {str(e).splitlines()[0][:120]})"
    return _translation_problem(ir.serde.deserialize_model(onnx.load_from_string(model.model_bytes)), providers)


_probe_lock = threading.Lock()
_probe_errors: dict[str, str] = {}


def probe_error(target: Any) -> str | None:
    """The last error translating ``target`` alone raised in this process (why it is "export failed")."""
    with _probe_lock:
        return _probe_errors.get(str(target))


def _probe_key(node: torch.fx.Node, providers: tuple[str, ...]) -> tuple[Any, ...]:
    def sig(v: Any) -> Any:
        m = _meta(v) if isinstance(v, torch.fx.Node) else v
        if isinstance(m, torch.Tensor):
            # Zero-size tensors translate differently (torchlib drops them from a Concat, which
            # then has no input): an answer learnt on one must not stand for non-empty ones.
            return ("T", m.dtype, m.dim(), any(type(s) is int and s == 0 for s in m.shape))
        if isinstance(m, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return ("S", type(m).__name__)
        if isinstance(m, (list, tuple)):
            return tuple(sig(x) for x in m)
        if isinstance(m, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(m)
        try:
            hash(m)
        except TypeError:
            return repr(m)
        return m

    args = tuple(sig(a) for a in node.args)
    kwargs = tuple(sorted((k, sig(v)) for k, v in node.kwargs.items()))
    out = sig(node)
    return (node.target, args, kwargs, out, providers)


def probe_op(node: torch.fx.Node, providers: tuple[str, ...], cache_dir: str | None = None) -> str | None:
    """Translate ``node`` alone and check every emitted ONNX node against ORT's kernels.

    Answers are memoised per (overload, dtypes, ranks, emptiness, constant arguments, providers), in
    memory and, with a compile cache directory, on disk for later processes.
    """
    return probe_ops([node], providers, cache_dir)[node]


def probe_ops(
    nodes: Sequence[torch.fx.Node], providers: tuple[str, ...], cache_dir: str | None = None
) -> dict[torch.fx.Node, str | None]:
    """:func:`probe_op` for many nodes at once.

    Signatures not answered yet are first translated together, one node per signature in one
    graph: when every emitted ONNX node has a kernel they are all supported (one translation
    instead of one per op, ~2.5x less time). Otherwise, or if that graph fails to translate,
    each is probed alone, so the answers are the same as :func:`probe_op`'s.
    """
    results: dict[torch.fx.Node, str | None] = {}
    keys: dict[torch.fx.Node, str] = {}
    unknown: dict[str, torch.fx.Node] = {}
    table = _probe_table(cache_dir)
    for node in nodes:
        try:
            key = json.dumps(_probe_key(node, providers), default=str)
        except Exception:
            results[node] = _probe_uncached(node, providers)
            continue
        keys[node] = key
        with _probe_lock:
            if key in table:
                results[node] = table[key]
                continue
        unknown.setdefault(key, node)
    if len(unknown) > 1 and _all_supported(list(unknown.values()), providers):
        answers: dict[str, str | None] = dict.fromkeys(unknown)
    else:
        answers = {key: _probe_uncached(node, providers) for key, node in unknown.items()}
    if answers:
        with _probe_lock:
            if len(table) + len(answers) > 8192:
                table.clear()
            table.update(answers)
            _dirty.add(cache_dir)
    for node, key in keys.items():
        if node not in results:
            results[node] = answers[key]
    return results


def _all_supported(nodes: Sequence[torch.fx.Node], providers: tuple[str, ...]) -> bool:
    """Whether one graph holding every node (each with its own inputs) translates, passes ONNX
    type inference and every emitted ONNX node has an ORT kernel on ``providers``."""
    from .export.fx import isolated_nodes_graph, translate

    try:
        return _translation_problem(translate(isolated_nodes_graph(nodes), name="probe", providers=providers), providers) is None
    except Exception:
        return False


_probe_tables: dict[str | None, dict[str, str | None]] = {}
_dirty: set[str | None] = set()


def _probe_table(cache_dir: str | None) -> dict[str, str | None]:
    with _probe_lock:
        table = _probe_tables.get(cache_dir)
        if table is not None:
            return table
    loaded: dict[str, str | None] = {}
    if cache_dir:
        from .runtime.disk_cache import disk_cache

        cache = disk_cache(cache_dir)
        doc = cache.get_json("support") if cache is not None else None
        if isinstance(doc, dict):
            loaded = {str(k): v if isinstance(v, str) else None for k, v in doc.items()}
    with _probe_lock:
        return _probe_tables.setdefault(cache_dir, loaded)


def save_support_table(cache_dir: str | None) -> None:
    """Write the support answers learnt in this process to the compile cache (when changed)."""
    if not cache_dir or cache_dir not in _dirty:
        return
    from .runtime.disk_cache import disk_cache

    cache = disk_cache(cache_dir)
    with _probe_lock:
        _dirty.discard(cache_dir)
        body = dict(_probe_tables.get(cache_dir, {}))
    if cache is not None:
        cache.put_json("support", body)


def _probe_uncached(node: torch.fx.Node, providers: tuple[str, ...]) -> str | None:
    from .export.fx import single_node_graph, translate

    try:
        model = translate(single_node_graph(node), name="probe", providers=providers)
    except Exception as e:
        cause: BaseException = e
        while cause.__cause__ is not None:  # the exporter wraps the translation's own error
            cause = cause.__cause__
        first_line = (str(cause).strip().splitlines() or [""])[0][:200]
        with _probe_lock:
            if len(_probe_errors) > 1024:
                _probe_errors.clear()
            _probe_errors[str(node.target)] = f"{type(cause).__name__}: {first_line}"
        return Reason.EXPORT_FAILED
    return _translation_problem(model, providers)


def _translation_problem(model: Any, providers: tuple[str, ...]) -> str | None:
    """Why ORT cannot load a translated ``onnx_ir`` model (a single-op probe), or None.

    Checks every node against ORT's kernel registry, then again with local functions inlined
    and ONNX type inference run (strict): function bodies carry no types, so a node inside one
    (``Erf`` of a double in ``aten_special_erf``) is only typed after inlining, and a node whose
    declared output type contradicts its schema (torchlib's float16 ``native_layer_norm``) fails
    there instead of at session creation.
    """
    import onnx
    import onnx_ir as ir

    from .export.fx import reinfer_types
    from .runtime.kernels import kernel_registry, session_refusal, unsupported_nodes

    bad = unsupported_nodes(model, providers)
    if not bad:
        # types are what ORT checks at load; torch's shapes of unused auxiliary outputs (empty
        # save_mean of an eval batch norm) may differ from the ONNX op's without harm
        try:
            inferred = reinfer_types(ir.serde.serialize_model(model), inline=True)
        except onnx.shape_inference.InferenceError as e:
            return f"{Reason.BAD_TRANSLATION}: {str(e).splitlines()[0][:160]}"
        bad = unsupported_nodes(ir.serde.deserialize_model(inferred), providers)
    if bad:
        return f"{Reason.NO_KERNEL}: " + ", ".join(sorted({b.describe() for b in bad}))
    if not kernel_registry().complete:  # no kernel list to check against: ask ORT itself
        refusal = session_refusal(inferred.SerializeToString(), providers)
        if refusal is not None:
            return f"{Reason.NO_KERNEL}: {refusal}"
    return None

"""Per-op rules every front door applies: distrusted translations, ops PyTorch runs faster.

* :data:`DISTRUSTED` and :data:`DISTRUSTED_WHEN`: overloads the exporter translates wrongly,
  always or for some arguments (:func:`distrust_reason` says why for a call);
* :data:`PREFERRED_WHEN`: ``torch_preferred_ops`` entries PyTorch runs faster only for some
  calls, with :func:`mark_runtime_weights`, which marks the convolutions whose check reads it;
* :func:`registered_ops`: the overloads the exporter translates; :func:`excluded_reason`: what
  ``torch_executed_ops`` / ``torch_preferred_ops`` keep in PyTorch.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat
from ..export.attention import not_fusable
from ..export.strided import layout_problem
from ..opnames import lookup, named_in, op_name
from ..options import Options
from ..reasons import Reason

__all__ = [
    "DISTRUSTED",
    "DISTRUSTED_WHEN",
    "PREFERRED_WHEN",
    "RUNTIME_WEIGHT",
    "CONV_MIN_FLOPS",
    "bound_arguments",
    "distrust_reason",
    "excluded_reason",
    "float32_exact",
    "mark_runtime_weights",
    "registered_ops",
    "translatable",
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
    (:func:`~ort_lazy.lowering.rewrites.integer_power`)."""
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


def distrust_reason(target: Any, arguments: Callable[[], dict[str, Any]]) -> str | None:
    """Why ``target``'s translation is distrusted (:data:`DISTRUSTED`, or :data:`DISTRUSTED_WHEN`
    for the bound ``arguments()``, asked only when a check needs them), or None."""
    if target in DISTRUSTED:
        return f"{Reason.DISTRUSTED} ({DISTRUSTED[target]})"
    check = DISTRUSTED_WHEN.get(target)
    why = check(arguments()) if check is not None else None
    return None if why is None else f"{Reason.DISTRUSTED} ({why})"


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


def float32_exact(value: float) -> bool:
    """Whether a Python float survives a round trip through float32."""
    try:
        return math.isnan(value) or struct.unpack("f", struct.pack("f", value))[0] == value
    except OverflowError:  # beyond float32's range
        return False


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


def _meta(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return value.meta.get("val", value.meta.get("example_value"))
    return value


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
    from ..export.selects import LARGE_SELECT

    def large(node: torch.fx.Node) -> bool:
        out = _meta(node)
        return isinstance(out, torch.Tensor) and (_compat.static_int(out.numel()) or 0) > LARGE_SELECT

    def runtime_weight(node: torch.fx.Node) -> bool:
        return bool(node.meta.get(RUNTIME_WEIGHT, False))

    return {torch.ops.aten.threshold_backward.default: large, torch.ops.aten.convolution.default: runtime_weight}


#: ``torch_preferred_ops`` entries PyTorch runs faster only for some calls: op -> check(node),
#: True where the node stays in PyTorch (named in ``torch_preferred_ops``, the others go to ORT).
PREFERRED_WHEN: dict[Any, Callable[[torch.fx.Node], bool]] = _preferred_when()


@functools.lru_cache(maxsize=8)
def registered_ops(cache_dir: str | None = None) -> frozenset[Any]:
    """aten overloads the exporter has a translation for (trusted or not).

    Building the exporter's registry costs seconds per process; with a compile cache directory
    the list is read from there, so a warm process never builds it unless it has to export.
    """
    from ..runtime.disk_cache import disk_cache

    cache = disk_cache(cache_dir)
    names = cache.get_json("registered-ops") if cache is not None else None
    if not isinstance(names, list):
        names = sorted({op_name(op) for op in _compat.onnx_implemented_overloads()})
        if cache is not None:
            cache.put_json("registered-ops", names)
    from ..export.translations import OWN_TRANSLATIONS

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

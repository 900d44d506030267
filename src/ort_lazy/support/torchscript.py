"""Whether ORT can run a TorchScript node of a bridge group, and why not.

Bridge groups are exported with the TorchScript exporter, so that exporter decides the mapping.
A node is checked against the rules every front door applies (:mod:`.rules`), against what the
TorchScript exporter translates wrongly for its inputs (:func:`_torchscript_distrusted`) and
against the memory layout a TorchScript graph does not carry (:data:`MEMORY_ADDRESSING`), then
probed: exported alone and every emitted ONNX node checked against ORT's kernels, memoised in
the tables of the FX probes (:mod:`.probes`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..opnames import lookup
from ..options import Options
from ..reasons import Reason
from .probes import _dirty, _probe_lock, _probe_table, _translation_problem
from .rules import _CARRIED, _DEVICES, bound_arguments, distrust_reason, excluded_reason, float32_exact

__all__ = ["MEMORY_ADDRESSING", "torchscript_reason"]


#: TorchScript ops whose result depends on their input's memory layout, which a TorchScript
#: graph does not carry: they stay in PyTorch (:mod:`ort_lazy.export.strided`); the bridge's
#: fusion pass leaves a graph holding one unfused, whole
MEMORY_ADDRESSING = {
    op: "addresses its input's memory, whose layout a TorchScript graph does not give"
    for op in ("aten::as_strided", "aten::as_strided_scatter")
}


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

    from ..export.torchscript import export_torchscript
    from ..runtime.bridge import no_fusion

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

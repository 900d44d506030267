"""Which aten op, with which dtypes, ORT can run on which execution provider.

One table serves every front door: an op is supported when the exporter has an ONNX
translation for its overload AND every ONNX node that translation emits for the op's actual
dtypes has a kernel on the chosen providers (ORT's kernel registry). The dtype half is decided
by translating the single op once per (overload, dtypes, arguments, providers) and checking the
emitted nodes, so e.g. bfloat16 ``Mul`` on CPU falls back up front instead of failing at session
creation.

* :mod:`~ort_lazy.support.rules`: what every front door applies per op (distrusted
  translations, ops PyTorch runs faster, the exporter's registry);
* :mod:`~ort_lazy.support.fx`: the reason for a node of an FX graph;
* :mod:`~ort_lazy.support.torchscript`: the reason for a TorchScript node of a bridge group;
* :mod:`~ort_lazy.support.probes`: translating one op and checking ORT's kernels, memoised.
"""

from __future__ import annotations

from ..reasons import Reason
from .fx import NEEDS_PROBE, graph_reasons, op_reason, static_reason, unsupported_reason
from .probes import probe_error, probe_op, probe_ops, save_support_table
from .rules import (
    CONV_MIN_FLOPS,
    DISTRUSTED,
    DISTRUSTED_WHEN,
    PREFERRED_WHEN,
    RUNTIME_WEIGHT,
    bound_arguments,
    distrust_reason,
    excluded_reason,
    float32_exact,
    mark_runtime_weights,
    registered_ops,
    translatable,
)
from .torchscript import MEMORY_ADDRESSING, torchscript_reason

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
    "MEMORY_ADDRESSING",
    "distrust_reason",
    "float32_exact",
]

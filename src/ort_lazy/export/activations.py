"""Activations as ORT's fused kernels.

``aten.gelu(x, approximate="tanh")`` in float32 (``nn.GELU(approximate="tanh")``, and the
written-out formulas :func:`ort_lazy.lowering.fusions.fuse_tanh_gelu` recognises) becomes ORT's
``FastGelu`` (domain ``com.microsoft``; CPU and CUDA kernels): one pass, where the exporter's
translation ran the formula op by op (ORT alone on 256 x 4096 floats, 2 cores: 0.21 ms against
0.62 ms; a compiled ``F.gelu(x, approximate="tanh")`` 1.01 -> 0.44 ms, eager's 0.58 ms). Its
values are those of the formula run by ORT op by op (the same ``tanh`` approximation: at most
1e-6 from eager, where eager's own rounding of ``1 + tanh`` leaves values near -5 a few 1e-7
from exact). Other dtypes and the erf form keep the exporter's
translation (float64 and the half types are rewritten before export:
:func:`ort_lazy.lowering.activations.gelu`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _compat
from .emitter import translation_emitter

__all__ = ["TRANSLATIONS"]

_aten = torch.ops.aten


def gelu(x: Any, approximate: str = "none") -> Any:
    """``aten.gelu``: ORT's ``FastGelu`` for the float32 tanh form, else the exporter's own."""
    import onnx_ir as ir

    if approximate != "tanh" or x.dtype != ir.DataType.FLOAT:
        return _compat.library_translation(_aten.gelu.default)(x, approximate=approximate)
    e = translation_emitter("gelu")
    out = e.op("FastGelu", x, domain="com.microsoft")
    # a type of its own: passes that retype a value (float16 narrowing) must not retype this one
    out.dtype, out.shape = x.dtype, x.shape
    return out


TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {_aten.gelu.default: gelu}

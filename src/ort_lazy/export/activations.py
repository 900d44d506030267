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

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import _compat
from .emitter import translation_emitter

__all__ = ["TRANSLATIONS", "contrib_ops"]

_aten = torch.ops.aten

#: whether this translation may emit ORT's ``com.microsoft`` ops (off for providers that read
#: standard ONNX only: :class:`ort_lazy.runtime.providers.RegionForm`)
_CONTRIB: contextvars.ContextVar[bool] = contextvars.ContextVar("ort_lazy_contrib_ops", default=True)


@contextlib.contextmanager
def contrib_ops(on: bool) -> Iterator[None]:
    """Translate activations inside the block as ORT's fused contrib ops (``on``) or as standard
    ONNX."""
    token = _CONTRIB.set(on)
    try:
        yield
    finally:
        _CONTRIB.reset(token)


def gelu(x: Any, approximate: str = "none") -> Any:
    """``aten.gelu``: ORT's ``FastGelu`` for the float32 tanh form (where contrib ops may be
    emitted), else the exporter's own."""
    import onnx_ir as ir

    if approximate != "tanh" or x.dtype != ir.DataType.FLOAT or not _CONTRIB.get():
        return _compat.library_translation(_aten.gelu.default)(x, approximate=approximate)
    e = translation_emitter("gelu")
    out = e.op("FastGelu", x, domain="com.microsoft")
    # a type of its own: passes that retype a value (float16 narrowing) must not retype this one
    out.dtype, out.shape = x.dtype, x.shape
    return out


TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {_aten.gelu.default: gelu}

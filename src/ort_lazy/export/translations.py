"""ort-lazy's own ONNX translations, added to the exporter's registry in one place.

Each module holds the translations of one kind, as ``TRANSLATIONS`` (aten overload ->
onnxscript-style function run by the exporter's translator): orthogonal polynomials as ONNX
``Loop`` (:mod:`.polynomials`), the ReLU gradient without ORT's slow ``Where`` and softmax whose
guard for rows of only ``-inf`` runs when such a row is there (:mod:`.selects`), max pooling
with PyTorch's indices from one ``MaxPool`` and eager's NaN rule (:mod:`.pooling`),
``as_strided_scatter`` as a ``ScatterND`` at the addressed positions (:mod:`.strided`), the
float32 tanh GELU as ORT's fused kernel (:mod:`.activations`), float32 attention as ONNX's
``Attention`` (:mod:`.attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _compat
from . import activations, attention, polynomials, pooling, selects, strided

__all__ = ["OWN_TRANSLATIONS", "register_own_translations"]

#: every aten overload ort-lazy translates itself, with its translation
OWN_TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    **polynomials.TRANSLATIONS,
    **selects.TRANSLATIONS,
    **pooling.TRANSLATIONS,
    **strided.TRANSLATIONS,
    **activations.TRANSLATIONS,
    **attention.TRANSLATIONS,
}


def register_own_translations(registry: Any) -> Any:
    """Add :data:`OWN_TRANSLATIONS` to the exporter's ``registry`` (once per registry)."""
    if getattr(registry, "_ort_lazy_translations", False):
        return registry
    for op, function in OWN_TRANSLATIONS.items():
        _compat.register_translation(registry, op, function)
    registry._ort_lazy_translations = True
    return registry

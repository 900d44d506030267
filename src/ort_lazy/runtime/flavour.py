"""Which onnxruntime is installed and what it accepts.

``onnxruntime``, ``onnxruntime-gpu`` and ``onnxruntime-training`` share the import name
``onnxruntime``; this module tells them apart and knows the newest ONNX IR version each takes.
"""

from __future__ import annotations

import functools
import importlib.metadata
from types import ModuleType

__all__ = ["OrtUnavailableError", "onnxruntime", "flavour", "ort_version", "max_ir_version"]

_FLAVOURS = ("onnxruntime-training", "onnxruntime-gpu", "onnxruntime")


class OrtUnavailableError(ImportError):
    """onnxruntime is missing or unusable."""


@functools.lru_cache(maxsize=1)
def onnxruntime() -> ModuleType:
    """The imported ``onnxruntime`` module, or a clear :class:`OrtUnavailableError`."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise OrtUnavailableError(
            "ort-lazy needs ONNX Runtime: `pip install onnxruntime` (CPU), "
            "`pip install onnxruntime-gpu` (CUDA) or `pip install onnxruntime-training` "
            f"(import failed: {e})"
        ) from e
    if not hasattr(ort, "InferenceSession"):
        raise OrtUnavailableError(
            "the installed onnxruntime is unusable (no InferenceSession); reinstall it with "
            "`pip install --force-reinstall onnxruntime`"
        )
    return ort


@functools.lru_cache(maxsize=1)
def flavour() -> str:
    """``onnxruntime``, ``onnxruntime-gpu`` or ``onnxruntime-training`` (the installed distribution)."""
    for name in _FLAVOURS:
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return "onnxruntime"


def ort_version() -> tuple[int, int]:
    """(major, minor) of the installed onnxruntime."""
    parts = onnxruntime().__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def max_ir_version() -> int:
    """The newest ONNX IR version the installed onnxruntime loads.

    onnxruntime-training stopped at 1.19, which rejects IR > 10; 1.20 onwards takes 11.
    """
    if flavour() == "onnxruntime-training" or ort_version() < (1, 20):
        return 10
    return 11

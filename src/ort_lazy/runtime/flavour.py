"""Which onnxruntime is installed and what it accepts.

``onnxruntime``, ``onnxruntime-gpu`` and ``onnxruntime-training`` share the import name
``onnxruntime``; this module tells them apart and knows the newest ONNX IR version each takes.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from types import ModuleType

__all__ = ["OrtUnavailableError", "onnxruntime", "flavour", "ort_version", "max_ir_version", "provider_problem"]

_FLAVOURS = (
    "onnxruntime-training",
    "onnxruntime-gpu",
    "onnxruntime-openvino",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-rocm",
    "onnxruntime",
)

#: The onnxruntime flavour that has an execution provider, and how to get it.
_PROVIDER_SOURCES = {
    "CUDAExecutionProvider": ("onnxruntime-gpu", "python build.py --use_cuda (or pip install onnxruntime-gpu in place of onnxruntime)"),
    "TensorrtExecutionProvider": ("onnxruntime-gpu", "python build.py --use_cuda (or pip install onnxruntime-gpu in place of onnxruntime)"),
    "ROCMExecutionProvider": ("onnxruntime-rocm", "pip install onnxruntime-rocm in place of onnxruntime"),
    "DmlExecutionProvider": ("onnxruntime-directml", "pip install onnxruntime-directml in place of onnxruntime (Windows)"),
    "OpenVINOExecutionProvider": (
        "onnxruntime-openvino",
        "python build.py --use_openvino (or pip install onnxruntime-openvino in place of onnxruntime); on Intel "
        "CPUs, GPUs and NPUs also as a plugin beside onnxruntime: pip install onnxruntime-ep-openvino and "
        "ep_libraries='onnxruntime_ep_openvino'",
    ),
    "QNNExecutionProvider": ("onnxruntime-qnn", "pip install onnxruntime-qnn in place of onnxruntime (Windows on Arm)"),
    "CoreMLExecutionProvider": ("onnxruntime on macOS", "pip install onnxruntime on macOS"),
}


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
    """The installed onnxruntime distribution: ``onnxruntime``, ``onnxruntime-gpu``,
    ``onnxruntime-training``, ``onnxruntime-openvino`` ..."""
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


def provider_problem(providers: Sequence[str]) -> str | None:
    """Why the installed onnxruntime cannot use every provider of ``providers`` (naming its
    flavour, the flavour that has them and how to get it), or None when it can."""
    available = list(onnxruntime().get_available_providers())
    missing = [p for p in providers if p not in available]
    if not missing:
        return None
    lines = []
    for provider in missing:
        source = _PROVIDER_SOURCES.get(provider)
        where = f"; it comes with {source[0]}: {source[1]}" if source else ""
        lines.append(f"{provider} is not in the installed onnxruntime flavour ({flavour()}){where}")
    return "; ".join(lines) + f" (installed providers: {', '.join(available)})"

"""Every private onnxruntime API ort-lazy uses, in one place.

The public ``InferenceSession.run_with_iobinding`` / ``IOBinding`` wrappers add Python work on
every call (a few microseconds per input); the hot path binds through the C objects underneath.
The kernel registry has no public accessor at all. Each function here says which attribute it
needs, so a change in onnxruntime fails in one place with a clear message.
"""

from __future__ import annotations

from typing import Any

from .flavour import OrtUnavailableError, onnxruntime

__all__ = ["c_api", "raw_session", "c_device", "new_binding", "kernel_defs", "ortvalue_of"]


def c_api() -> Any:
    """``onnxruntime.capi._pybind_state`` (the compiled module behind the public API)."""
    onnxruntime()
    try:
        from onnxruntime.capi import _pybind_state
    except ImportError as e:  # pragma: no cover - depends on the onnxruntime layout
        raise OrtUnavailableError(f"onnxruntime's compiled module moved ({e})") from e
    return _pybind_state


def raw_session(session: Any) -> Any:
    """The C session inside a public ``InferenceSession`` (``session._sess``)."""
    return session._sess


def c_device(kind: str, index: int) -> Any:
    """The C ``OrtDevice`` for ``kind`` (``cpu``/``cuda``) and ``index``."""
    return onnxruntime().OrtDevice.make(kind, index)._get_c_device()


def new_binding(raw: Any) -> Any:
    """A C ``SessionIOBinding`` on a raw session (see :func:`raw_session`)."""
    return c_api().SessionIOBinding(raw)


def kernel_defs() -> list[Any]:
    """Every kernel definition the installed onnxruntime registers (all providers)."""
    return list(c_api().get_all_opkernel_def())


def ortvalue_of(tensor: Any) -> Any:
    """A public ``OrtValue`` viewing ``tensor``'s memory (DLPack: any dtype, CPU or CUDA).

    The tensor must outlive every session given the value.
    """
    ort = onnxruntime()
    return ort.OrtValue(c_api().OrtValue.from_dlpack(tensor.detach().__dlpack__()))

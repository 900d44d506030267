"""Every private onnxruntime API ort-lazy uses, in one place.

The public ``InferenceSession.run_with_iobinding`` / ``IOBinding`` wrappers add Python work on
every call (a few microseconds per input); the hot path binds through the C objects underneath.
The kernel registry has no public accessor at all. Each function here says which attribute it
needs, so a change in onnxruntime fails in one place with a clear message.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .flavour import OrtUnavailableError, onnxruntime

__all__ = [
    "c_api",
    "raw_session",
    "c_device",
    "new_binding",
    "KernelDef",
    "KernelDefsUnavailableError",
    "provider_libraries",
    "kernel_defs",
    "READ_APART",
    "ortvalue_of",
]


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


@dataclasses.dataclass(frozen=True)
class KernelDef:
    """One kernel definition: the fields of ORT's ``KernelDef`` the support table reads."""

    op_name: str
    domain: str
    provider: str
    version_range: tuple[int, int]
    type_constraints: dict[str, list[str]]

    @classmethod
    def of(cls, d: Any) -> KernelDef:
        """From ORT's C ``KernelDef``."""
        lo, hi = d.version_range
        constraints = {k: list(v) for k, v in d.type_constraints.items()}
        return cls(d.op_name, d.domain, d.provider, (int(lo), int(hi)), constraints)


class KernelDefsUnavailableError(RuntimeError):
    """onnxruntime's kernel list could not be read (the reason is the message)."""


def provider_libraries() -> list[str]:
    """The execution-provider libraries the installed onnxruntime loads on demand (CUDA,
    TensorRT, ROCm, OpenVINO ...; none in the CPU package)."""
    import glob

    folder = os.path.dirname(c_api().__file__)
    found = glob.glob(os.path.join(folder, "*onnxruntime_providers_*"))
    return sorted(f for f in found if "providers_shared" not in os.path.basename(f))


#: onnxruntime flavours with provider libraries whose kernel list is read in a child process
#: (the others are never listed: see :func:`kernel_defs`)
READ_APART = frozenset({"onnxruntime-gpu"})

# Run in a child process: reads every provider's kernels and prints them as JSON.
_READ_KERNELS = """
import json, sys
from onnxruntime.capi import _pybind_state as c
json.dump([[d.op_name, d.domain, d.provider, list(d.version_range),
            {k: list(v) for k, v in d.type_constraints.items()}] for d in c.get_all_opkernel_def()], sys.stdout)
"""


def kernel_defs() -> list[KernelDef]:
    """Every kernel definition the installed onnxruntime registers (all providers).

    ``get_all_opkernel_def`` creates every provider the build has; where one of their
    libraries cannot load (onnxruntime-gpu without TensorRT's ``libnvinfer``: the usual GPU
    install), it dereferences a null factory and kills the process. Builds with provider
    libraries are therefore read in a child process. Raises
    :class:`KernelDefsUnavailableError` when that child fails.
    """
    libraries = provider_libraries()
    if not libraries:
        return [KernelDef.of(d) for d in c_api().get_all_opkernel_def()]
    from .flavour import flavour

    if flavour() not in READ_APART:
        raise KernelDefsUnavailableError(
            f"{flavour()} builds in execution providers ({', '.join(os.path.basename(p) for p in libraries)}) "
            "that may not survive the listing; it is not attempted"
        )
    return _kernel_defs_apart(_READ_KERNELS)


def _kernel_defs_apart(code: str) -> list[KernelDef]:
    import json
    import signal
    import subprocess
    import sys

    # the onnxruntime this process imported, whatever the child's own search path holds
    root = os.path.dirname(os.path.dirname(onnxruntime().__file__))
    code = f"import sys; sys.path.insert(0, {root!r})\n" + code
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelDefsUnavailableError(f"could not run a process to read them: {e}") from e
    if done.returncode != 0:
        if done.returncode < 0:
            how = f"the process reading them died of {signal.Signals(-done.returncode).name}"
        else:
            how = f"the process reading them failed (exit {done.returncode})"
        # ORT names the provider library it could not load on stderr
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        loading = [line[line.index("Failed to load library"):] for line in lines if "Failed to load library" in line]
        detail = loading[0] if loading else (lines[-1] if lines else "")
        raise KernelDefsUnavailableError(f"{how}: {detail[:300]}")
    try:
        rows = json.loads(done.stdout)
        return [KernelDef(n, dom, p, (int(v[0]), int(v[1])), c) for n, dom, p, v, c in rows]
    except (ValueError, TypeError) as e:
        raise KernelDefsUnavailableError(f"unreadable output from the process reading them: {e}") from e


def ortvalue_of(tensor: Any) -> Any:
    """A public ``OrtValue`` viewing ``tensor``'s memory (DLPack: any dtype, CPU or CUDA).

    The tensor must outlive every session given the value.
    """
    ort = onnxruntime()
    return ort.OrtValue(c_api().OrtValue.from_dlpack(tensor.detach().__dlpack__()))

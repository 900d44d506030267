"""TorchScript (``torch.jit.script`` / ``torch.jit.trace``) on ONNX Runtime.

Usage::

    import ort_lazy
    ort_lazy.jit.enable()                # or: with ort_lazy.jit.enable(): ...
    f = torch.jit.script(fn)
    f(x); f(x)                           # from the 2nd call the supported region runs on ORT

The profiling executor optimizes a graph after its first call (``torch._C.
_jit_set_num_profiled_runs``); the ORT regions appear then. Needs the compiled bridge
(``python build.py --enable_lazy_tensor``).
"""

from __future__ import annotations

from .frontends.jit import BridgeUnavailableError, bridge_info, disable, enable, is_enabled

__all__ = ["enable", "disable", "is_enabled", "bridge_info", "BridgeUnavailableError"]

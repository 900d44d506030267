"""LazyTensor on ONNX Runtime.

Usage::

    import ort_lazy
    ort_lazy.lazy.init()                 # instead of torch._lazy.ts_backend.init()
    x = torch.randn(4, device="lazy")
    y = (x * x).sum()
    torch._lazy.mark_step()              # the traced step runs, its supported part on ORT

Needs the compiled bridge (``python build.py --enable_lazy_tensor``).
"""

from __future__ import annotations

from .frontends.lazy import init, is_initialized, shutdown
from .runtime.bridge import BridgeUnavailableError

__all__ = ["init", "shutdown", "is_initialized", "BridgeUnavailableError"]

"""LazyTensor front door: the LTC TorchScript backend, with ORT executing its graphs.

``torch._lazy.ts_backend`` lowers each traced step to a TorchScript graph and runs it with
a ``GraphExecutor``; the bridge's post pass (see :mod:`ort_lazy.runtime.bridge`) fuses the
supported nodes of those graphs, forward and backward alike, into groups that run on ORT.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _compat, metrics
from ..options import Options
from ..runtime import bridge as _bridge
from . import jit as _jit  # noqa: F401  (installs the bridge's callbacks)
from .settings import resolve_options

__all__ = ["init", "is_initialized", "shutdown", "clear_cache"]

_lock = threading.Lock()
_backend_ready = False


def init(**options: Any) -> Options:
    """Initialise the LazyTensor TorchScript backend and make ORT its executor.

    Keyword arguments are :class:`~ort_lazy.options.Options` fields. Calling it again
    replaces the options. Returns the options in effect.

    Raises:
        RuntimeError: the bridge is not built (the message says how to build it) or was
            built against another torch.
        OptionsError: an invalid option.
    """
    global _backend_ready
    opts = resolve_options(**options)
    try:
        bridge = _bridge.load_bridge()
    except _bridge.BridgeUnavailableError as e:
        raise _bridge.BridgeUnavailableError(f"ort_lazy.lazy.init(): {e}") from e
    with _lock:
        if not _backend_ready:
            if not _compat.lazy_backend_registered():  # init twice is an error in torch
                _compat.init_lazy_ts_backend()
            _backend_ready = True
        # add's alpha=1 (and other 0/1 scalars) become constants instead of
        # aten::ScalarImplicit(device data), which would cut every add out of the groups.
        bridge.set_handle_special_scalars(True)
    _bridge.activate("lazy", opts)
    # Graphs compiled before (plain TorchScript, or other options) would keep their plan.
    bridge.clear_lazy_computation_cache()
    _warn_if_distributed()
    return opts


def _warn_if_distributed() -> None:
    """LazyTensor cannot take part in torch.distributed: say so once instead of failing oddly."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        metrics.warn_once(
            "lazy-distributed",
            "ort-lazy: LazyTensor does not support torch.distributed: DistributedDataParallel rejects "
            "device='lazy' parameters (gloo/NCCL take only CPU/CUDA tensors) and collectives on lazy "
            "tensors do not communicate. Use torch.compile(model, backend='ort') with DDP instead.",
        )


def clear_cache() -> None:
    """Drop LazyTensor's compiled graphs: the next steps are compiled with the current options."""
    if _backend_ready:
        _bridge.load_bridge().clear_lazy_computation_cache()


def shutdown() -> None:
    """Stop running lazy graphs on ORT (the LazyTensor backend itself stays initialised).

    Compiled graphs are dropped, so later steps run in plain TorchScript.
    """
    _bridge.deactivate("lazy")
    clear_cache()


def is_initialized() -> bool:
    """Whether :func:`init` is in effect."""
    return "lazy" in _bridge.users()

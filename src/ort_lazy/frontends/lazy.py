"""LazyTensor front door: the LTC TorchScript backend, with ORT executing its graphs.

``torch._lazy.ts_backend`` lowers each traced step to a TorchScript graph and runs it with
a ``GraphExecutor``; the bridge's post pass (see :mod:`ort_lazy.runtime.bridge`) fuses the
supported nodes of those graphs, forward and backward alike, into groups that run on ORT.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch

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
            _register_lazy_kernels()
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


#: ATen kernels for the Lazy dispatch key, replacing LazyTensor's own (kept alive here)
_lazy_kernels: Any = None


def _register_lazy_kernels() -> None:
    """Kernels for ops LazyTensor itself gets wrong (with or without ORT).

    ``pixel_shuffle``: its ATen kernel works through views, which LazyTensor's view replay
    turns into an ``as_strided_copy`` of the wrong tensor: values of unrelated memory (torch
    2.13's TorchScript backend alone returns values up to 1e27). Written with the copying
    forms of its views (``view_copy``, ``permute_copy``), it traces to ops LazyTensor lowers
    correctly.
    """
    global _lazy_kernels
    if _lazy_kernels is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
        warnings.simplefilter("ignore", UserWarning)
        lib.impl("pixel_shuffle", _pixel_shuffle, "Lazy")
    _lazy_kernels = lib


def _pixel_shuffle(x: Any, factor: int) -> Any:
    """``torch.nn.functional.pixel_shuffle`` from functional ops: (*, C*r*r, H, W) -> (*, C, H*r, W*r)."""
    if x.dim() < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but got input with {x.dim()} dimension(s)")
    if factor <= 0:
        raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {factor}")
    *batch, channels, height, width = x.shape
    if channels % (factor * factor):
        raise RuntimeError(
            "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
            f"upscale_factor, but input.size(-3)={channels} is not divisible by {factor * factor}"
        )
    aten = torch.ops.aten
    n = len(batch)
    out_channels = channels // (factor * factor)
    # below functionalization (the Lazy key): the copying forms of the views
    y = aten.view_copy.default(x.contiguous(), [*batch, out_channels, factor, factor, height, width])
    # (c, i, j, h, w) -> (c, h, i, w, j): output row h*r+i, column w*r+j
    y = aten.permute_copy.default(y, [*range(n), n, n + 3, n + 1, n + 4, n + 2])
    return aten.view_copy.default(y.contiguous(), [*batch, out_channels, height * factor, width * factor])


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

"""TorchDynamo front door: ``torch.compile(model, backend="ort")``.

Registered through the ``torch_dynamo_backends`` entry point, so no import is needed. Dynamo
captures the graph; :func:`ort_lazy.lowering.aten.compile_captured` lowers it to aten and hands
the pieces to ORT. Options are read when a graph is compiled, so ``ORT_LAZY_*`` variables set
after ``torch.compile`` but before the first call take effect.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat, metrics
from ..lowering.aten import compile_captured
from ..options import Options, OptionsError
from .settings import resolve_options

__all__ = ["ort_backend", "make_backend", "compile"]


_DDP_ADVICE = (
    "ort-lazy: torch.compile(DistributedDataParallel(model)) compiles no graph for this model: dynamo stops in "
    "DDP's forward and does not trace %s.forward (a torch.nn class) as a frame of its own, so it runs in plain "
    "PyTorch. Compile the module inside DDP instead: DDP(torch.compile(model, backend='ort'))."
)


def _is_ours(backend: Any) -> bool:
    return getattr(_compat.unwrap_backend(backend), "_ort_lazy_backend", False)


def _check_ddp_frame() -> None:
    """After dynamo converts a frame: warn once when it was a DDP forward compiled with the
    ``ort`` backend whose module dynamo will never trace (``torch.compile(DDP(nn.Sequential))``
    silently runs eager on torch 2.13)."""
    found = _compat.frame_being_compiled()
    if found is None:
        return
    frame_locals, backend = found
    ddp = next((v for v in frame_locals.values() if isinstance(v, torch.nn.parallel.DistributedDataParallel)), None)
    if ddp is None or not _is_ours(backend):
        return
    inner = ddp.module
    if _compat.dynamo_skips(type(inner).forward.__code__):
        metrics.increment("ddp_uncompiled")
        metrics.warn_once("ddp-uncompiled", _DDP_ADVICE, type(inner).__name__)


_compat.on_dynamo_frame_compiled(_check_ddp_frame)


#: ``torch.compile``'s ``mode`` names as ort-lazy options. The modes tune Inductor; here
#: ``max-autotune`` times each region on ORT and in PyTorch and keeps the faster (``autotune``),
#: and ``reduce-overhead`` (Inductor's CUDA graphs) has no counterpart: the defaults.
COMPILE_MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {},
    "max-autotune": {"autotune": True},
    "max-autotune-no-cudagraphs": {"autotune": True},
}


def mode_options(mode: str | None) -> dict[str, Any]:
    """The options ``torch.compile(..., mode=mode)`` stands for. Raises :class:`OptionsError`."""
    if mode is None:
        return {}
    if mode not in COMPILE_MODES:
        raise OptionsError(f"mode: unknown value {mode!r}; accepted: {', '.join(COMPILE_MODES)}")
    return dict(COMPILE_MODES[mode])


def make_backend(options: Options | Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A dynamo backend callable bound to ``options`` (an :class:`Options` or a dict of fields).

    A mapping is validated at once and re-read with the environment at each compile.
    """
    resolve_options(options)

    def backend(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None, **_: Any
    ) -> Callable[..., Any]:
        return compile_captured(gm, example_inputs, resolve_options(options, **mode_options(mode)))

    backend._ort_lazy_backend = True  # type: ignore[attr-defined]
    return backend


def ort_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | Options | None = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """The ``ort`` dynamo backend: ``torch.compile(model, backend="ort", options={...})``;
    ``mode=`` (instead of ``options``, as torch.compile requires) is read by :data:`COMPILE_MODES`."""
    return compile_captured(gm, example_inputs, resolve_options(options, **mode_options(mode)))


ort_backend._ort_lazy_backend = True  # type: ignore[attr-defined]


def compile(
    model: Any, *, dynamic: bool | None = None, fullgraph: bool = False, mode: str | None = None, **options: Any
) -> Any:
    """``torch.compile(model, backend="ort")`` with ort-lazy options as keyword arguments (or as
    ``options={...}``, a mapping or an :class:`Options`, as ``torch.compile`` takes them).

    ``dynamic`` is both torch.compile's and :attr:`Options.dynamic`: ``False`` compiles for
    concrete shapes only, ``None`` (default) follows ``ORT_LAZY_DYNAMIC`` (on: dynamo turns
    dims symbolic once they change and one ONNX model serves every size). ``mode`` is one of
    :data:`COMPILE_MODES` (options given explicitly win over it).
    """
    given = options.pop("options", None)
    options = {**mode_options(mode), **options}
    if dynamic is not None:
        options["dynamic"] = dynamic
    opts = resolve_options(given, **options)  # invalid options raise here, not at the first call
    torch_dynamic = dynamic if dynamic is not None else (None if opts.dynamic else False)
    # a mapping is re-read with the environment when a graph is compiled; Options stay as given
    bound: Options | dict[str, Any] = opts if isinstance(given, Options) else {**dict(given or {}), **options}
    backend = functools.partial(ort_backend, options=bound)
    return torch.compile(model, backend=backend, dynamic=torch_dynamic, fullgraph=fullgraph)

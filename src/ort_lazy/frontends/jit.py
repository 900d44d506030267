"""TorchScript front door (``ort_lazy.jit.enable()``), and the bridge's Python callbacks.

The bridge (:mod:`ort_lazy.runtime.bridge`) fuses ORT-supported nodes of TorchScript graphs into
``ort::CompilationGroup`` nodes; this module answers its three callbacks: the fusion predicate
(:func:`ort_lazy.support.torchscript_reason`, the table every front door uses), the group
factory (a :class:`~ort_lazy.runtime.region.TorchScriptGroup` exporting with the TorchScript
exporter) and the count of group runs left to TorchScript.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any

import torch

from .. import _compat, metrics, support
from ..debug.compare import MismatchError
from ..export.torchscript import export_torchscript
from ..options import Options
from ..reasons import Reason
from ..runtime import bridge
from ..runtime.bridge import BridgeUnavailableError, bridge_info, load_bridge
from ..runtime.region import TorchScriptGroup
from .settings import resolve_options

__all__ = ["BridgeUnavailableError", "load_bridge", "bridge_info", "enable", "disable", "is_enabled"]

_support_cache: dict[str, str | None] = {}


def _fallback_name(op: str, overload: str) -> str:
    """``aten::mul`` and ``Tensor`` -> ``aten.mul.Tensor`` (``default`` when there is no overload
    name), the form every front door records fallbacks under."""
    return f"{op.replace('::', '.')}.{overload or 'default'}"


def _support(key: str, op: str, overload: str, inputs: Sequence[Any], graph: torch._C.Graph) -> bool:
    """Fusion predicate for one node (``op`` like ``aten::mul``; ``inputs`` described by C++,
    ``graph`` the node alone)."""
    options = bridge.options()
    if options is None:
        return False
    reason = _support_cache.get(key, False)
    if reason is False:
        reason = support.torchscript_reason(op, overload, inputs, options, graph)
        if len(_support_cache) > 16384:
            _support_cache.clear()
        _support_cache[key] = reason
    if reason is not None:
        metrics.record_fallback(_fallback_name(op, overload), reason)
        return False
    return True


def _make_group(graph: torch._C.Graph, name: str) -> TorchScriptGroup:
    options = bridge.options() or resolve_options()
    ops = [n.kind().replace("::", ".") for n in graph.nodes() if n.kind() not in ("prim::Constant", "prim::TupleConstruct")]

    def export(tensors: Sequence[torch.Tensor]) -> Any:
        return export_torchscript(graph, tensors, name=name, no_fusion=bridge.no_fusion)

    def reference(tensors: Sequence[Any]) -> Any:
        fn = _compat.function_from_graph(name + "_check", graph)
        with bridge.no_fusion():
            return fn(*tensors)

    # Scripted functions run their own ops between groups on PyTorch's threads: ORT threads
    # spinning within a group's run cost more than they save there (MLP forward+backward:
    # 4.2 vs 1.9 ms per step). LazyTensor steps are groups separated by tracing: spinning
    # pays (MLP step 3.76 vs 3.99 ms).
    spinning = options.allow_spinning if options.allow_spinning is not None else bridge.users() == {"lazy"}
    return TorchScriptGroup(name, options, ops, source=graph, export=export, reference=reference, spinning=spinning)


def _on_torch_run(group: str, reason: str) -> None:
    metrics.increment("torch_runs")


#: why the bridge's fusion pass turned an aten node down before asking :func:`_support`
_REJECTED = {
    "outputs": f"{Reason.UNFUSABLE}: several outputs (the fuser groups single-output nodes)",
    "output": f"{Reason.UNFUSABLE}: a non-tensor output",
    "scalar": f"{Reason.UNFUSABLE}: a scalar input computed in the graph, not a constant",
    "untyped": f"{Reason.UNFUSABLE}: an input without a profiled dtype and rank",
    "schema": f"{Reason.UNFUSABLE}: no operator schema",
    "mutable": Reason.MUTATION,
    # the whole graph stays in TorchScript
    "memory": f"{Reason.DISTRUSTED} ({support.MEMORY_ADDRESSING['aten::as_strided']}; the graph runs in TorchScript)",
}


def _rejected(op: str, overload: str, why: str) -> None:
    """Records an aten node the fusion pass turned down before the support predicate."""
    if bridge.options() is None:
        return
    metrics.record_fallback(_fallback_name(op, overload), _REJECTED.get(why, f"{Reason.UNFUSABLE}: {why}"))


def _install(module: ModuleType) -> None:
    module.install(_support, _make_group, _on_torch_run, (MismatchError,), _rejected)


bridge.set_installer(_install)
bridge.on_change(_support_cache.clear)


class _Enabled:
    """Returned by :func:`enable`; as a context manager it restores the previous state."""

    def __init__(self, previous: tuple[bool, Options | None]) -> None:
        self._previous = previous

    def __enter__(self) -> _Enabled:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        was_on, options = self._previous
        if was_on and options is not None:
            bridge.activate("jit", options)
        else:
            bridge.deactivate("jit")


def enable(**options: Any) -> _Enabled:
    """Run the ORT-supported regions of TorchScript graphs on ORT (see ``ort_lazy.jit.enable``)."""
    opts = resolve_options(**options)
    previous = ("jit" in bridge.users(), bridge.options())
    bridge.activate("jit", opts)
    return _Enabled(previous)


def disable() -> None:
    """Stop fusing TorchScript graphs; groups fused earlier run in TorchScript."""
    bridge.deactivate("jit")


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return "jit" in bridge.users()

"""TorchScript front door, and the Python half of the bridge shared with LazyTensor.

The compiled bridge (``ort_lazy._bridge``, built from ``cpp/``) registers a TorchScript
post pass that fuses ORT-supported nodes into ``ort::CompilationGroup`` nodes and an
operator that runs such a node. This module gives it its three callbacks:

* :func:`_support`: the fusion predicate, answered by :func:`ort_lazy.support.op_reason`
  (the table the Dynamo path uses) and cached per (overload, input dtypes/shapes, constants);
* :class:`_Group`: one per group node; exports the subgraph once per input schema (dtype,
  sizes, strides, device) and runs it with :class:`~ort_lazy.runtime.session.OrtRunner`;
  returns ``None`` to make the operator run the group in TorchScript instead;
* :func:`_on_torch_run`: counts group executions left to TorchScript.

The pass is process-wide: it is on while :func:`enable` (TorchScript) or
``ort_lazy.lazy.init`` (LazyTensor) is in effect, with the options given last.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import torch

from .. import _compat, metrics
from ..options import Options

__all__ = ["BridgeUnavailableError", "load_bridge", "bridge_info", "enable", "disable", "is_enabled"]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_BUILD_INFO = _PACKAGE_DIR / "_bridge_build.json"
_BUILD_HINT = "build it with `python build.py --enable_lazy_tensor` (or `python cpp/build_bridge.py`)"


class BridgeUnavailableError(ImportError, RuntimeError):
    """The compiled bridge is missing or was built against another torch."""


_lock = threading.RLock()
_bridge: ModuleType | None = None
_options: Options | None = None
_users: set[str] = set()
_support_cache: dict[str, str | None] = {}


def bridge_info() -> dict[str, Any] | None:
    """What ``_bridge_build.json`` records about the built bridge, or None if not built."""
    try:
        return json.loads(_BUILD_INFO.read_text())
    except (OSError, ValueError):
        return None


def load_bridge() -> ModuleType:
    """Import ``ort_lazy._bridge`` after checking it matches the running torch.

    Raises:
        BridgeUnavailableError: not built, or built against another torch (both versions
            and the rebuild command are named).
    """
    global _bridge
    if _bridge is not None:
        return _bridge
    with _lock:
        if _bridge is not None:
            return _bridge
        info = bridge_info()
        libs = [p for p in _PACKAGE_DIR.glob("_bridge.*") if p.suffix in (".so", ".pyd")]
        if info is None or not libs:
            raise BridgeUnavailableError(
                f"the ort-lazy LazyTensor/TorchScript bridge is not built in {_PACKAGE_DIR}; {_BUILD_HINT}"
            )
        built = info.get("torch_version")
        if built != torch.__version__:
            raise BridgeUnavailableError(
                f"the ort-lazy bridge was built against torch {built} but torch {torch.__version__} "
                f"is installed; rebuild it with `python build.py --enable_lazy_tensor`"
            )
        try:
            module = importlib.import_module("ort_lazy._bridge")
        except ImportError as e:
            raise BridgeUnavailableError(f"the ort-lazy bridge failed to load ({e}); {_BUILD_HINT}") from e
        from ..debug.compare import MismatchError

        module.install(_support, _make_group, _on_torch_run, (MismatchError,))
        _bridge = module
        return module


# -- the three callbacks ------------------------------------------------------------------


def _support(key: str, op: str, overload: str, inputs: Sequence[Any]) -> bool:
    """Fusion predicate for one node (``op`` like ``aten::mul``; ``inputs`` described by C++)."""
    options = _options
    if options is None:
        return False
    reason = _support_cache.get(key, False)
    if reason is False:
        reason = _reason(op, overload, inputs, options)
        if len(_support_cache) > 16384:
            _support_cache.clear()
        _support_cache[key] = reason
    if reason is not None:
        metrics.record_fallback(f"{op.replace('::', '.')}.{overload or 'default'}", reason)
        return False
    return True


def _reason(op: str, overload: str, inputs: Sequence[Any], options: Options) -> str | None:
    from .. import support
    from ..export.torchscript import _COPY_TO_VIEW

    # The exporter rewrites functionalized ``*_copy`` ops to their views (same values), so
    # they are supported exactly when the view op is.
    op = _COPY_TO_VIEW.get(op, op)
    namespace, name = op.split("::", 1)
    try:
        target = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except AttributeError:
        return support.Reason.NO_MAPPING
    device: torch.device | None = None
    values: list[Any] = []
    for desc in inputs:
        if desc[0] == "tensor":
            _, dtype, sizes, dev = desc
            shape = [1] * sizes if isinstance(sizes, int) else list(sizes)
            values.append(torch.empty(shape, dtype=dtype, device="meta"))
            if dev is not None and device is None:
                device = torch.device(dev)
        else:
            values.append(desc[1])
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for arg, value in zip(target._schema.arguments, values):
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    try:
        output = target(*args, **kwargs)
    except Exception:
        return support.Reason.NO_MAPPING
    providers = options.resolve_providers(device)
    try:
        return support.op_reason(target, args, kwargs, output, options, providers)
    except Exception:
        return support.Reason.EXPORT_FAILED


def _on_torch_run(group: str, reason: str) -> None:
    metrics.increment("torch_runs")


class _Plan:
    """A compiled group for one input schema: the ORT runner and which inputs it binds."""

    __slots__ = ("runner", "select")

    def __init__(self, runner: Any, select: list[int] | None) -> None:
        self.runner = runner
        self.select = select

    def run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.select is not None:
            tensors = [tensors[i] for i in self.select]
        return self.runner.run(tensors)


class _Group:
    """Runs one ``ort::CompilationGroup`` node on ORT, one exported model per input schema."""

    def __init__(self, graph: torch._C.Graph, name: str, options: Options) -> None:
        self.graph = graph
        self.name = name
        self.options = options
        self.plans: dict[tuple[Any, ...], _Plan | None] = {}
        n_ops = sum(1 for n in graph.nodes() if n.kind() != "prim::Constant" and n.kind() != "prim::TupleConstruct")
        self.too_small = n_ops < options.min_block_size
        self._times = metrics.series(f"run:{name}")
        metrics.increment("regions_compiled")

    def run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Outputs of the group computed by ORT, or None to run it in TorchScript."""
        key = tuple((t.dtype, t.shape, t.stride(), t.get_device()) for t in tensors)  # -1: CPU
        try:
            plan = self.plans[key]
        except KeyError:
            plan = self.plans[key] = self._compile(tensors)
        if plan is None:
            return None
        start = time.perf_counter()
        try:
            outputs = plan.run(tensors)
        except Exception as e:
            from ..runtime.session import OrtRunError

            if not isinstance(e, OrtRunError):
                raise
            self._failed("ort_failures", "ORT could not run", e)
            self.plans[key] = None
            return None
        self._times.append(time.perf_counter() - start)
        if self.options.run_type == "debug":
            self._compare(tensors, outputs)
        return outputs

    def _compile(self, tensors: list[torch.Tensor]) -> _Plan | None:
        if self.too_small or self.options.run_type == "pytorch":
            return None
        from ..export.torchscript import export_torchscript
        from ..runtime.session import OrtRunError, OrtRunner

        try:
            with metrics.timed("export"):
                model = export_torchscript(self.graph, tensors, name=self.name, no_fusion=_no_fusion)
        except Exception as e:
            self._failed("export_failures", "could not export", e)
            return None
        if self.options.dump_dir:
            from ..debug.dump import dump_region

            try:
                dump_region(self.options.dump_dir, self.name, self.graph, model)
            except OSError as e:
                metrics.warn_once(f"dump:{self.options.dump_dir}", "ort-lazy: cannot write dumps: %s", e)
        device = tensors[0].device if tensors else torch.device("cpu")
        # Scripted functions run their own ops between groups on PyTorch's threads: ORT threads
        # spinning within a group's run cost more than they save there (MLP forward+backward:
        # 4.2 vs 1.9 ms per step). LazyTensor steps are groups separated by tracing: spinning
        # pays (MLP step 3.76 vs 3.99 ms).
        spinning = self.options.allow_spinning
        if spinning is None:
            with _lock:
                spinning = _users == {"lazy"}
        try:
            runner = OrtRunner(model, self.options, device, spinning=spinning, threads=_group_threads(tensors, model))
        except OrtRunError as e:
            self._failed("ort_failures", "ORT could not load", e)
            return None
        metrics.increment("regions_on_ort")
        names = [f"in_{i}" for i in range(len(tensors))]
        select = None if model.input_names == names else [int(n[3:]) for n in model.input_names]
        return _Plan(runner, select)

    def _failed(self, counter: str, what: str, error: Exception) -> None:
        from ..support import Reason

        metrics.increment(counter)
        metrics.increment("fallback_regions")
        reason = Reason.EXPORT_FAILED if counter == "export_failures" else Reason.ORT_FAILED
        metrics.record_fallback(self.name, reason)
        metrics.warn_once(
            f"ts-group:{counter}:{self.name}",
            "ort-lazy: %s TorchScript group %s (%s); it runs in TorchScript",
            what,
            self.name,
            error,
        )

    def _compare(self, tensors: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        """The ``debug`` run type: run the group in TorchScript too, time it, compare (raises)."""
        from ..debug.compare import compare_outputs

        fn = _compat.function_from_graph(self.name + "_check", self.graph)
        start = time.perf_counter()
        with _no_fusion():
            ref = fn(*tensors)
        metrics.record_time(f"debug_torch:{self.name}", time.perf_counter() - start)
        ref = ref if isinstance(ref, tuple) else (ref,)
        compare_outputs(self.name, list(ref), list(outputs), self.options.rtol, self.options.atol)


#: Groups that read and write fewer elements than this run on one ORT thread (a second one
#: costs more to wake than it saves: scripted MLP forward+backward 1.88 -> 1.82 ms per step).
SMALL_GROUP_ELEMENTS = 1 << 18


def _group_threads(tensors: Sequence[torch.Tensor], model: Any) -> int | None:
    """ORT intra-op threads for a group: 1 when it moves little data, else PyTorch's count
    (the runner applies it to CPU sessions only)."""
    if not all(spec.static for spec in model.output_specs):
        return None
    total = sum(t.numel() for t in tensors) + sum(math.prod(spec.shape) for spec in model.output_specs)
    return 1 if total < SMALL_GROUP_ELEMENTS else None


def _make_group(graph: torch._C.Graph, name: str) -> _Group:
    options = _options if _options is not None else Options.from_env()
    return _Group(graph, name, options)


@contextlib.contextmanager
def _no_fusion() -> Iterator[None]:
    bridge = load_bridge()
    bridge.push_pass_disabled()
    try:
        yield
    finally:
        bridge.pop_pass_disabled()


# -- activation ---------------------------------------------------------------------------


def activate(user: str, options: Options) -> None:
    """Turn the pass on for ``user`` (``"jit"`` or ``"lazy"``) with ``options``."""
    global _options
    bridge = load_bridge()
    with _lock:
        if _options is None or _options != options:
            _support_cache.clear()
        _options = options
        _users.add(user)
        bridge.set_enabled(True)


def deactivate(user: str) -> None:
    """Turn the pass off for ``user``; it stays on while another user needs it."""
    with _lock:
        _users.discard(user)
        if _bridge is not None:
            _bridge.set_enabled(bool(_users))


def current_options() -> Options | None:
    """The options groups are compiled with now (None when never enabled)."""
    return _options


class _Enabled:
    """Returned by :func:`enable`; as a context manager it restores the previous state."""

    def __init__(self, previous: tuple[bool, Options | None]) -> None:
        self._previous = previous

    def __enter__(self) -> _Enabled:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        was_on, options = self._previous
        if was_on and options is not None:
            activate("jit", options)
        else:
            deactivate("jit")


def enable(**options: Any) -> _Enabled:
    """Run the ORT-supported regions of TorchScript graphs on ORT (see ``ort_lazy.jit.enable``)."""
    opts = Options.from_env(**options)
    previous = ("jit" in _users, _options)
    activate("jit", opts)
    return _Enabled(previous)


def disable() -> None:
    """Stop fusing TorchScript graphs; groups fused earlier run in TorchScript."""
    deactivate("jit")


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return "jit" in _users

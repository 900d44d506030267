"""The runtime of a compiled region, shared by every front door.

A region is a piece of a graph that runs on ORT, with a PyTorch twin it falls back to. Two
kinds exist: :class:`OrtRegion` (a fused FX submodule of the dynamo / fx path; its twin is the
submodule) and :class:`TorchScriptGroup` (an ``ort::CompilationGroup`` of the TorchScript bridge;
its twin is the group's subgraph run by TorchScript). What they share lives in :class:`Region`,
written once: opening runners (session failures fall back), running (run failures fall back
for good), counting, dumps and the ``debug`` run type's comparison.

Export lives above the runtime: a region that needs another model (one per input shape or
schema) is given an ``export`` callable by whoever made it.
"""

from __future__ import annotations

import collections
import logging
import math
import operator
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import metrics
from ..debug.compare import compare_region, widened
from ..debug.nvtx import nvtx_range
from ..opnames import op_name
from ..options import Options
from ..reasons import Reason
from ..specs import OrtModel
from .iobinding import ORT_DEVICES
from .quirks import model_vector_matmul
from .session import OrtRunner
from .session_cache import session_cache
from .session_create import OrtCheckError, OrtInputError, OrtRunError
from .threads import PARK_TRAINING, TRIAL_AFTER, ThreadTrial, model_flops, region_plan, thread_trial

__all__ = ["Region", "OrtRegion", "TorchScriptGroup", "open_runner", "ops_text", "report_fallback", "dump", "compute_ops", "dense_order", "in_layout", "traced_order"]

logger = logging.getLogger("ort_lazy")

_VERSION = operator.attrgetter("_version")
_DATA_PTR = torch.Tensor.data_ptr


def ops_text(ops: Sequence[str], limit: int = 6) -> str:
    """``aten.add.Tensor, aten.mul.Tensor and 3 more``-like text for messages."""
    names = sorted(set(ops))
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def open_runner(
    model: OrtModel,
    options: Options,
    device: torch.device,
    *,
    spinning: bool,
    weights: dict[int, torch.Tensor] | None = None,
    one_thread: bool | None = None,
    training: bool = False,
) -> OrtRunner:
    """An :class:`OrtRunner` for ``model`` with the thread count and parking the region's size
    calls for (:func:`~.threads.region_plan`; ``one_thread`` True or False overrides its thread
    count: one, or PyTorch's; a ``training`` graph's multi-threaded runs always park, see
    :data:`~.threads.PARK_TRAINING`);
    ``weights`` (by graph position) back the model's external initializers: ORT views a
    tensor's memory only when it is contiguous, so a weight in another layout (a channels-last
    convolution's) is given as a contiguous copy, which the runner keeps (the region follows
    the weight itself and builds a new runner when it changes).

    Raises:
        OrtRunError: the session could not be created.
    """
    threads, park = region_plan(model_flops(model)) if device.type == "cpu" else (None, False)
    if one_thread is not None and device.type == "cpu":
        threads = 1 if one_thread else None
    if training and PARK_TRAINING and device.type == "cpu":
        park = True  # a one-thread runner has nothing to park
    initializers = (
        {name: weights[pos].contiguous() for name, pos in model.external.items()} if weights and model.external else None
    )
    return OrtRunner(model, options, device, spinning=spinning, threads=threads, initializers=initializers, park=park)


def learn_facts(model: OrtModel, device: torch.device) -> None:
    """Work out what opening a runner for ``model`` on ``device`` reads from its bytes (its
    work, for the thread plan on the CPU; whether a MatMul sees a vector, for ORT's optimizers),
    so a model the compile cache keeps carries them and a warm process need not parse it."""
    model_vector_matmul(model)
    if device.type == "cpu":
        model_flops(model)


def report_fallback(name: str, ops: Sequence[str], counter: str, reason: str, error: BaseException, what: str) -> None:
    """Count a region failure (``counter``), its ops as falling back for ``reason``; warn once."""
    metrics.increment(counter)
    metrics.increment("fallback_regions")
    for op in ops:
        metrics.record_fallback(op, reason)
    metrics.warn_once(f"{counter}:{name}:{error}", "ort-lazy: %s %s (%s), it runs in PyTorch: %s", what, name, ops_text(ops), error)


def dump(options: Options, name: str, source: Any, model: OrtModel) -> None:
    """Write a region's model and source when ``dump_dir`` is set (never fails the region)."""
    if not options.dump_dir:
        return
    from ..debug.dump import dump_region

    try:
        dump_region(options.dump_dir, name, source, model)
    except OSError as e:
        metrics.warn_once(f"dump:{options.dump_dir}", "ort-lazy: cannot write dumps to %s: %s", options.dump_dir, e)


class Region:
    """What every compiled region does the same way: open, run, fall back, count, compare, dump.

    ``ops`` names the region's operators (for messages and fallback counts); ``reference``
    computes the region's outputs in PyTorch from the same inputs (the ``debug`` run type).
    """

    def __init__(self, name: str, options: Options, ops: Sequence[str], reference: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
        self.name = name
        self.options = options
        self.ops = list(ops)
        self.reference = reference
        self._run_type = options.run_type
        self._nvtx = options.nvtx
        self._times = metrics.series(f"run:{name}")
        #: what explain shows for this region
        self.report: dict[str, Any] = {}

    def fall_back(self, counter: str, reason: str, error: BaseException, what: str) -> None:
        """See :func:`report_fallback`."""
        report_fallback(self.name, self.ops, counter, reason, error, what)

    def dump(self, source: Any, model: OrtModel) -> None:
        """See :func:`dump`."""
        dump(self.options, self.name, source, model)

    def open(self, model: OrtModel, device: torch.device, spinning: bool) -> OrtRunner | None:
        """A runner for ``model``, or None (counted, warned once) when ORT cannot load it."""
        try:
            return open_runner(model, self.options, device, spinning=spinning)
        except Exception as e:  # session creation faults (bad model, missing kernel, provider)
            self.fall_back("ort_failures", Reason.ORT_FAILED, e, "ORT cannot run")
            return None

    def run_ort(self, runner: OrtRunner, args: Sequence[Any], all_args: Sequence[Any] | None = None) -> list[torch.Tensor] | None:
        """The outputs of ``runner`` on ``args``; None when ORT failed (the caller stops using
        that runner and runs PyTorch). In the ``debug`` run type, compared with the PyTorch twin
        run on ``all_args`` (default ``args``).

        Raises:
            OrtInputError: only these inputs cannot run on ORT; the caller runs this call in
                PyTorch and keeps the runner.
        """
        start = time.perf_counter()
        try:
            if self._nvtx:
                with nvtx_range(f"ort_lazy.run:{self.name}", True):
                    outs = runner.run(args)
            else:
                outs = runner.run(args)
        except OrtRunError as e:
            if not e.lasting:
                # only these inputs cannot run on ORT (a device it cannot read): this call
                # runs in PyTorch, the runner stays for the next
                metrics.warn_once(f"input:{self.name}:{e}", "ort-lazy: %s; this call of %s runs in PyTorch", e, self.name)
                raise
            metrics.increment("ort_failures")
            metrics.warn_once(f"run:{self.name}:{e}", "ort-lazy: %s (%s); running it in PyTorch from now on", e, ops_text(self.ops))
            return None
        self._times.append(time.perf_counter() - start)
        if self._run_type == "debug":
            self.compare(args if all_args is None else all_args, outs)
        return outs

    def compare(self, args: Sequence[Any], outs: Sequence[Any]) -> None:
        """Run the PyTorch twin on ``args``, time it, and raise if ``outs`` differ
        (:func:`~ort_lazy.debug.compare.compare_region`)."""
        compare_region(self.name, self.reference, args, outs, self.options, lambda jitter=None: self.exact(args, jitter))

    def exact(self, args: Sequence[Any], jitter: torch.Generator | None = None) -> Any:
        """The twin's result with float inputs widened to float64 (moved by their rounding with
        a ``jitter`` generator: :func:`~ort_lazy.debug.compare.widened`): the debug run type's
        arbiter."""
        return self.reference([widened(a, jitter) for a in args])


#: calls of a region whose inputs set its model's checks before it takes the exact forms (each
#: such call runs on ORT, then in PyTorch)
CHECKS_BEFORE_EXACT = 3


def compute_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The names of ``gm``'s compute ops (getitem plumbing left out)."""
    return [op_name(n.target) for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def dense_order(val: Any) -> tuple[int, ...] | None:
    """The order of ``val``'s dims in memory (outermost first) when it is a tensor laid out
    densely (contiguous, channels-last, a permuted copy); None for non-dense and non-tensor
    values, and for symbolic strides (reading a SymInt's value would specialize the shape)."""
    if not isinstance(val, torch.Tensor):
        return None
    if not all(isinstance(x, int) for x in (*val.shape, *val.stride())):
        return None
    strides, shape = list(val.stride()), list(val.shape)
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    dense = math.prod(shape) == 0 or all(
        strides[d] == math.prod(shape[e] for e in order[k + 1 :]) for k, d in enumerate(order) if shape[d] != 1
    )
    return order if dense else None


def traced_order(val: Any) -> tuple[int, ...] | None:
    """:func:`dense_order` of a value a graph was traced with in a dense layout other than the
    contiguous one (what ORT returns): None for contiguous ones."""
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    order = dense_order(val)  # static sizes only: is_contiguous() on symbolic ones adds a guard
    if order is None or math.prod(val.shape) == 0:
        return None
    expected = 1
    for size, stride in reversed(list(zip(val.shape, val.stride()))):
        if size != 1 and stride != expected:
            return order
        expected *= size
    return None  # contiguous (a dim of size 1 may have any stride)


def _traced_layouts(gm: torch.fx.GraphModule) -> dict[int, tuple[int, ...]]:
    """Placeholder position -> :func:`traced_order` of the tensor ``gm`` was traced with, where
    it has one."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    orders = {i: traced_order(node.meta.get("val")) for i, node in enumerate(placeholders)}
    return {i: order for i, order in orders.items() if order is not None}


def in_layout(value: Any, order: tuple[int, ...]) -> Any:
    """``value`` with its dims laid out in memory in ``order`` (outermost first): itself when
    they already are, else a copy."""
    if not isinstance(value, torch.Tensor) or value.dim() != len(order):
        return value
    if order == tuple(range(len(order))):
        return value.contiguous()
    permuted = value.permute(order)
    if permuted.is_contiguous():
        return value
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return permuted.contiguous().permute(inverse)


class OrtRegion(Region, torch.nn.Module):
    """One fused FX submodule on ORT; falls back to the submodule if ORT fails at run time.

    ``constants`` maps input positions of ``torch_module`` to the parameters the model binds
    itself (callers no longer pass them), as ``weights`` says (:data:`~ort_lazy.specs.WEIGHT_MODES`):
    with ``shared`` and ``copied`` every call checks that no parameter changed (its version
    counter and storage) and rebuilds the session, or the model, when one did, so a result
    is never computed from stale weights. ``export(graph, name)`` makes a model of a graph of
    the submodule with the parameters' current values (used for those rebuilds, and when the
    ``dynamic`` option is off and the model is symbolic: one model per input shape).
    """

    def __init__(
        self,
        name: str,
        torch_module: torch.fx.GraphModule,
        runner: OrtRunner,
        options: Options,
        tuple_output: bool,
        *,
        constants: dict[int, torch.Tensor] | None = None,
        weights: str = "snapshot",
        export: Callable[..., OrtModel] | None = None,
        training: bool = False,
    ) -> None:
        torch.nn.Module.__init__(self)
        Region.__init__(self, name, options, compute_ops(torch_module), self._torch)
        self.torch_module = torch_module
        self.constants = dict(sorted((constants or {}).items()))
        self._layouts = _traced_layouts(torch_module)
        self.weights = weights
        self._follow = bool(self.constants) and weights in ("shared", "copied") and export is not None
        self._followed = tuple(self.constants.values())
        self._state = self._weight_state() if self._follow else ()
        self.runner: OrtRunner | None = runner
        #: a training graph's region (its runners park PyTorch's workers whenever multi-threaded)
        self.training = training
        self.tuple_output = tuple_output
        self.record: Any = None
        self._export = export
        #: calls whose inputs set a check output of the model; at :data:`CHECKS_BEFORE_EXACT`
        #: the region takes the exact forms (:meth:`_take_exact_forms`)
        self._checks_set = 0
        self._checked = True
        self._autotune_pending = options.autotune and options.run_type == "ort"
        symbolic = any(not s.static for s in runner.model.input_specs)
        self._per_shape: collections.OrderedDict[Any, OrtRunner | None] | None = (
            collections.OrderedDict() if symbolic and not options.dynamic and export is not None else None
        )
        #: a thread trial's verdict (one thread, or PyTorch's count), kept by later runners
        self._one_thread: bool | None = None
        #: the region's :class:`~.threads.ThreadTrial`: None when it has none (or it ended),
        #: before it starts the number of calls left until it does
        self._trial: ThreadTrial | int | None = TRIAL_AFTER if self._plans_trial(runner) else None
        self._trial_lock = threading.Lock()

    def _plans_trial(self, runner: OrtRunner) -> bool:
        """True when ``runner``'s thread count is worth a trial (:func:`~.threads.thread_trial`):
        a CPU region of the ``ort`` run type whose work falls in the trial's range, with more
        than one PyTorch thread and no thread count in ``session_options``."""
        options = self.options
        if (
            runner.device.type != "cpu"
            or options.run_type != "ort"
            or options.autotune
            or self._per_shape is not None
            or torch.get_num_threads() < 2
            or "intra_op_num_threads" in options.session_options
        ):
            return False
        return thread_trial(model_flops(runner.model))

    def _trial_runner(self, runner: OrtRunner) -> tuple[OrtRunner, ThreadTrial | None]:
        """The runner for this call while a thread trial is due or runs, with the trial to
        time it (None: untimed); ends the trial at its verdict (or when the region's runner
        changed under it: refreshed weights, exact forms). Calls from several threads take
        their turns one at a time here."""
        with self._trial_lock:
            runner = self._trial_turn(runner)
            trial = self._trial
            return runner, trial if isinstance(trial, ThreadTrial) else None

    def _trial_turn(self, runner: OrtRunner) -> OrtRunner:
        trial = self._trial
        if trial is None:  # ended by another thread's call
            return self.runner or runner
        if isinstance(trial, int):
            if trial > 0:
                self._trial = trial - 1
                return runner
            # the trial's first call opens the other thread count's runner
            one = runner.threads == 1
            try:
                other = self._reopened(runner.model, runner, one_thread=not one)
            except Exception as e:  # the planned runner stays
                logger.info("ort-lazy: %s keeps its planned threads (%s)", self.name, e)
                self._trial = None
                return runner
            self._trial = trial = ThreadTrial(runner, other, runner if one else other)
        if trial.planned is not runner:
            self._trial = None
            self._drop(trial.other(trial.planned), runner)
            return runner
        winner = trial.winner()
        if winner is None:
            return trial.runner()  # type: ignore[no-any-return]
        one_ms, other_ms = (t * 1e3 for t in trial.medians())
        self._one_thread = winner.threads == 1
        self.runner = winner
        self._trial = None
        self._drop(trial.other(winner), winner)
        metrics.increment("thread_trials")
        self.report["threads"] = {"one_ms": one_ms, "other_ms": other_ms, "one_thread": self._one_thread}
        logger.info(
            "ort-lazy: thread trial %s: one thread %.3f ms, %d threads %.3f ms -> %s",
            self.name, one_ms, torch.get_num_threads(), other_ms, "one" if self._one_thread else "PyTorch's count",
        )
        return winner

    @staticmethod
    def _drop(runner: OrtRunner, kept: OrtRunner) -> None:
        """Take ``runner``'s session out of the session cache (with its prepacked weights)
        unless ``kept`` runs the same one."""
        if runner.cache_key != kept.cache_key:
            session_cache().discard(runner.cache_key)

    def _weight_state(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The bound parameters' version counters and data pointers (C-level getters: every
        call of a region that follows its weights reads them)."""
        tensors = self._followed
        return tuple(map(_VERSION, tensors)), tuple(map(_DATA_PTR, tensors))

    def _refresh(self) -> None:
        """A parameter changed: a session (``shared``) or a model (``copied``) for its new value."""
        assert self._export is not None and self.runner is not None
        self._state = self._weight_state()
        metrics.increment("weight_refreshes")
        if self._per_shape is not None:
            self._per_shape.clear()
        old = self.runner
        try:
            model = old.model if self.weights == "shared" else self._export(self.torch_module, self.name, self._checked)
            self.runner = self._reopened(model, old)
            self._drop(old, self.runner)  # the old weights' session is never asked for again
        except Exception as e:  # the region runs in PyTorch from now on: never a stale result
            self.fall_back("ort_failures", Reason.ORT_FAILED, e, "cannot refresh the weights of")
            self.runner = None

    def forward(self, *args: Any) -> Any:
        if self._follow and self.runner is not None and self._weight_state() != self._state:
            self._refresh()
        runner = self.runner
        if runner is not None and self._per_shape is not None:
            runner = self._shape_runner(args)
        if runner is not None and self._autotune_pending:
            self._autotune_pending = False
            if not self._autotune(runner, args):
                self.runner = runner = None
        if runner is None or self._run_type == "pytorch":
            metrics.increment("torch_runs")
            return self._torch(args)
        trial = None
        if self._trial is not None:
            runner, trial = self._trial_runner(runner)
        lasting = True
        start = time.perf_counter() if trial is not None else 0.0
        try:
            outs = self.run_ort(runner, args)
            if trial is not None and outs is not None:
                trial.record(runner, time.perf_counter() - start)
        except OrtInputError as e:  # only these inputs: this call runs in PyTorch (outside the handler)
            outs, lasting = None, False
            if isinstance(e, OrtCheckError):
                self._checks_set += 1
                if self._checks_set >= CHECKS_BEFORE_EXACT:
                    self._take_exact_forms()
        if outs is None:
            if lasting:
                self.runner = None
                self._trial = None
            else:
                metrics.increment("torch_runs")
            return self._torch(args)
        return tuple(outs) if self.tuple_output else outs[0]

    def _reopened(self, model: OrtModel, like: OrtRunner, one_thread: bool | None = None) -> OrtRunner:
        """A runner for another model of this region (refreshed weights, exact forms, one
        input shape): ``like``'s device and spinning, the region's bound weights, the thread
        count of the region's trial (or ``one_thread``)."""
        one = self._one_thread if one_thread is None else one_thread
        return open_runner(
            model, self.options, like.device, spinning=like.spinning, weights=self.constants, one_thread=one, training=self.training
        )

    def _take_exact_forms(self) -> None:
        """The model's checks were set on :data:`CHECKS_BEFORE_EXACT` calls: from now on the
        region runs a model with the exact forms (max pooling's NaN rule in an ``If``), so such
        inputs run on ORT instead of on ORT and then in PyTorch."""
        if self._export is None or self.runner is None or not self._checked:
            return
        self._checked = False
        old = self.runner
        if self._per_shape is not None:
            self._per_shape.clear()
        try:
            model = self._export(self.torch_module, self.name, False)
            self.runner = self._reopened(model, old)
            self._drop(old, self.runner)
        except Exception as e:  # the checked model stays: correct, only slower on such inputs
            metrics.warn_once(f"exact:{self.name}:{e}", "ort-lazy: %s keeps its checked model: %s", self.name, e)
            return
        metrics.increment("exact_form_switches")
        metrics.warn_once(
            f"exact:{self.name}",
            "ort-lazy: the inputs of %s set its checks %d times; it now runs the exact forms on ORT",
            self.name, self._checks_set,
        )

    def _shape_runner(self, args: tuple[Any, ...]) -> OrtRunner | None:
        """The runner of a model exported for exactly these input shapes (bounded LRU)."""
        assert self._per_shape is not None and self._export is not None and self.runner is not None
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        if key in self._per_shape:
            self._per_shape.move_to_end(key)
            return self._per_shape[key]
        runner = None
        try:
            from torch.fx.experimental.proxy_tensor import make_fx

            concrete = make_fx(self.torch_module, tracing_mode="fake")(*self._full_args(args))
            model = self._export(concrete, f"{self.name}_{len(self._per_shape)}", self._checked)
            runner = self._reopened(model, self.runner)
        except Exception as e:  # this shape runs in PyTorch; others may still run on ORT
            metrics.increment("export_failures")
            metrics.warn_once(f"shape:{self.name}:{e}", "ort-lazy: %s for shapes %s runs in PyTorch: %s", self.name, key, e)
        self._per_shape[key] = runner
        while len(self._per_shape) > self.options.cache_size:
            self._per_shape.popitem(last=False)
        return runner

    def _autotune(self, runner: OrtRunner, args: tuple[Any, ...], calls: int = 5) -> bool:
        """Time this region on ORT and in PyTorch on real inputs; True when ORT is faster."""
        full = self._twin_args(args)
        ort_t: list[float] = []
        torch_t: list[float] = []
        try:
            runner.run(args)
            self.torch_module(*full)
            for _ in range(calls):
                start = time.perf_counter()
                runner.run(args)
                ort_t.append(time.perf_counter() - start)
                start = time.perf_counter()
                self.torch_module(*full)
                torch_t.append(time.perf_counter() - start)
        except OrtRunError:
            return True  # the normal path reports and falls back
        ort_ms, torch_ms = statistics.median(ort_t) * 1e3, statistics.median(torch_t) * 1e3
        chosen = "ort" if ort_ms <= torch_ms else "pytorch"
        self.report["autotune"] = {"ort_ms": ort_ms, "pytorch_ms": torch_ms, "chosen": chosen}
        metrics.record_time(f"autotune_ort:{self.name}", ort_ms / 1e3)
        metrics.record_time(f"autotune_torch:{self.name}", torch_ms / 1e3)
        if chosen == "pytorch":
            metrics.increment("autotune_kept_in_pytorch")
            from ..debug.records import mark

            for op in self.ops:
                metrics.record_fallback(op, Reason.AUTOTUNE)
                if self.record is not None:
                    mark(self.record, op, Reason.AUTOTUNE)
        logger.info("ort-lazy: autotune %s: ORT %.3f ms, PyTorch %.3f ms -> %s", self.name, ort_ms, torch_ms, chosen)
        return chosen == "ort"

    def _full_args(self, args: Sequence[Any]) -> list[Any]:
        full = list(args)
        for index, value in self.constants.items():
            full.insert(index, value)
        return full

    def _twin_args(self, args: Sequence[Any]) -> list[Any]:
        """The twin's arguments: the constants put in, and each tensor in the memory layout
        the graph was traced with (a region's outputs are contiguous where PyTorch's op would
        have made them channels-last, and the twin's views rely on the traced strides)."""
        full = self._full_args(args)
        for i, order in self._layouts.items():
            if i < len(full):
                full[i] = in_layout(full[i], order)
        return full

    def _torch(self, args: Sequence[Any]) -> Any:
        return self.torch_module(*self._twin_args(args))

    def exact(self, args: Sequence[Any], jitter: torch.Generator | None = None) -> Any:
        return self.torch_module(*[widened(a, jitter) for a in self._twin_args(args)])


class TorchScriptGroup(Region):
    """One ``ort::CompilationGroup`` of the TorchScript bridge, one ORT model per input schema.

    :meth:`run` returns the group's outputs computed by ORT, or None to make the bridge run the
    group in TorchScript. ``export(tensors)`` makes the model for these inputs' schema;
    ``reference(tensors)`` runs the subgraph in TorchScript (the ``debug`` run type).
    """

    def __init__(
        self,
        name: str,
        options: Options,
        ops: Sequence[str],
        *,
        source: Any,
        export: Callable[[Sequence[torch.Tensor]], OrtModel],
        reference: Callable[[Sequence[Any]], Sequence[Any]],
        spinning: bool,
    ) -> None:
        super().__init__(name, options, ops, reference)
        self.source = source
        self._export = export
        self._spinning = spinning
        self.plans: dict[tuple[Any, ...], tuple[OrtRunner, list[int] | None] | None] = {}
        self.too_small = len(self.ops) < options.min_block_size
        if self.too_small:
            for op in self.ops:
                metrics.record_fallback(op, Reason.SMALL_REGION)
            metrics.warn_once(
                f"min_block_size:{options.min_block_size}",
                "ort-lazy: min_block_size=%d keeps TorchScript group %s (%d ops) off ORT; lower min_block_size / "
                "ORT_LAZY_MIN_BLOCK_SIZE",
                options.min_block_size,
                name,
                len(self.ops),
            )
        metrics.increment("regions_compiled")

    def run(self, tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Outputs of the group computed by ORT, or None to run it in TorchScript."""
        key = tuple((t.dtype, t.shape, t.stride(), t.device) for t in tensors)
        try:
            plan = self.plans[key]
        except KeyError:
            plan = self.plans[key] = self._compile(tensors)
        if plan is None:
            return None
        runner, select = plan
        try:
            outs = self.run_ort(runner, tensors if select is None else [tensors[i] for i in select], tensors)
        except OrtInputError:
            return None
        if outs is None:
            self.plans[key] = None
        return outs

    def _compile(self, tensors: list[torch.Tensor]) -> tuple[OrtRunner, list[int] | None] | None:
        if self.too_small or self._run_type == "pytorch":
            return None
        devices = sorted({t.device.type for t in tensors} - set(ORT_DEVICES))
        if devices:  # a group fused for CPU/CUDA graphs, run with tensors ORT cannot read
            for op in self.ops:
                metrics.record_fallback(op, Reason.UNSUPPORTED_DEVICE)
            metrics.warn_once(f"device:{self.name}:{devices}", "ort-lazy: %s runs in TorchScript for tensors on %s", self.name, ", ".join(devices))
            return None
        try:
            with metrics.timed("export"), nvtx_range(f"ort_lazy.export:{self.name}", self._nvtx):
                model = self._export(tensors)
        except Exception as e:
            self.fall_back("export_failures", Reason.EXPORT_FAILED, e, "could not export TorchScript group")
            return None
        self.dump(self.source, model)
        # the first GPU tensor's device (a CPU scalar may come first), else the CPU
        device = next((t.device for t in tensors if t.is_cuda), torch.device("cpu"))
        runner = self.open(model, device, self._spinning)
        if runner is None:
            return None
        metrics.increment("regions_on_ort")
        names = [f"in_{i}" for i in range(len(tensors))]
        select = None if model.input_names == names else [int(n[3:]) for n in model.input_names]
        return runner, select

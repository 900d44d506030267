"""ort-lazy benchmark suite: eager, Inductor, ``torch.compile(backend="ort")`` and the raw ORT floor.

Every built-in model (:data:`ort_lazy.models.BUILTIN`) runs side by side in one process:

* ``eager``: plain PyTorch;
* ``inductor``: ``torch.compile(model)`` (Inductor, its caches off so the first call is cold);
* ``ort``: ``torch.compile(model, backend="ort")``;
* ``ort+freeze``: the same with ``freeze_weights=True`` (inference, with ``--freeze``);
* ``floor``: the ONNX graphs ort-lazy runs, executed directly by ORT with inputs and outputs
  bound once (IOBinding, ``run_with_iobinding``), same session options (inference only);
* ``floor+freeze``: the floor of the frozen graphs (inference, with ``--freeze``);
* ``aot-eager``: ``torch.compile(model, backend="aot_eager")`` (training): dynamo and
  AOTAutograd with PyTorch's own kernels, what every backend behind AOTAutograd (Inductor,
  ort-lazy's training graphs) pays before its kernels run; the ``ort`` training row's ``x floor``
  is against it;
* ``best-ort``: the best direct ORT run of the same model: ``torch.onnx.export(dynamo=True)``
  with its optimizer, weights as initializers, ORT's default CPU session options, inputs and
  outputs bound once (inference only). Every row reports ``x best`` against it;
* ``dynamo+best-ort``: ``torch.compile`` with the least backend on ORT: its compiled function
  binds the model's inputs and fresh outputs to ``best-ort``'s session and runs it, nothing
  else (inference). Its ``x best`` is dynamo's own per-call cost, which no ``torch.compile``
  backend avoids; ``ort``'s ratio to it is the per-call cost ort-lazy adds;
* ``ort-int8``: ``torch.compile(backend="ort")`` with ``precision="int8-dynamic"`` (inference):
  ``x ort`` is its time over the fp32 ``ort`` row's, ``max rel`` its largest error against eager
  over eager's largest magnitude (int8 is approximate);
* ``ort-fast``: ``fast_math=True`` (ORT's approximate logistic, max pooling without eager's
  NaN rule): ``x ort`` and ``max rel`` as for ``ort-int8``;
* ``ort-fp16``: ``precision="fp16"`` (inference, ``--device cuda`` only, where it is a default
  row): ``x ort`` and ``max rel`` as for ``ort-int8``;
* ``eager-mixed`` / ``ort-mixed``: the mixed regime, each call right after one 512x512 PyTorch
  matmul (what a graph with PyTorch work between ORT regions, or a training step, sees). The
  matmul's own time, measured alone, is taken off: ``penalty`` is the remaining time over the
  same backend's time alone.

Besides the built-in models, ``--models`` takes real models (:data:`_models.ZOO`: BERT,
GPT-2, ResNet-18, EfficientNet-B0, ViT-Tiny from transformers' classes, random weights).

Modes: ``inference`` (eval, ``torch.no_grad``) and ``train`` (forward, ``backward``, SGD step).
Timed calls of all rows of one model and mode are interleaved in rounds so drift in machine
load hits every row alike. Per row: median and p90 per call, first call (compile) time, peak
memory, and ratios against eager, the floor and Inductor.

Peak memory (``peak MiB``) is measured from the resident set size (RSS): ``retained``, the RSS
growth from just before a row is built to just after its warm-up (its model copy, compiled code,
ORT sessions and arenas), plus ``call peak``, the peak RSS above the RSS just before 3
steady-state calls (sampled every 0.2 ms from ``/proc/self/statm``). Every reading follows a
``gc.collect()`` and ``malloc_trim(0)``, so freed heap is not counted. tracemalloc is not used:
it cannot see PyTorch's or ORT's native allocations.

Run ``python benchmarks/bench.py --help`` for the options; ``ort-lazy bench`` calls :func:`main`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from _floor import FloorRunner, capture_regions, export_floor, least_backend  # noqa: E402
from _models import ZOO  # noqa: E402

__all__ = ["main", "run_suite", "BACKENDS", "TARGETS", "Row", "Case", "Prepared", "Backend"]

MODES = ("inference", "train")
DEFAULT_BACKENDS = (
    "eager", "dynamo", "inductor", "aot-eager", "ort", "floor", "best-ort", "dynamo+best-ort", "ort-int8", "eager-mixed",
    "ort-mixed",
)
#: the PyTorch work before each call of a mixed-regime row: one matmul of this size
MIXED_MM = 512


def known_models() -> dict[str, Any]:
    """Every model ``--models`` accepts: the built-ins, then the zoo."""
    from ort_lazy.models import BUILTIN

    return {**BUILTIN, **ZOO}


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass
class Case:
    """One model in one mode, with everything a backend needs to build its row."""

    model_name: str
    mode: str
    template: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    threads: int
    ort_options: dict[str, Any]
    #: where the model and its inputs live (``cpu`` or ``cuda``)
    device: str = "cpu"

    @property
    def train(self) -> bool:
        """Whether rows run a training step."""
        return self.mode == "train"

    def fresh_model(self) -> torch.nn.Module:
        """A copy of the template (same weights) in the mode's train/eval state."""
        model = copy.deepcopy(self.template)
        return model.train() if self.train else model.eval()


@dataclasses.dataclass
class Prepared:
    """A built row: one call (``step``), the first call's time and output, and notes."""

    step: Callable[[], Any]
    first_call_s: float
    output: Any = None
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Backend:
    """A way to run a :class:`Case`; ``build`` compiles it and makes the first call."""

    name: str
    modes: tuple[str, ...]
    build: Callable[[Case], Prepared]
    floor_of: dict[str, str] = dataclasses.field(default_factory=dict)  # mode -> the row ``vs_floor`` uses
    alone: str | None = None  # mixed-regime rows: the row of the same backend called alone
    reduced: bool = False  # a reduced-precision or fast_math row: compared with the fp32 ``ort`` row
    devices: tuple[str, ...] = ("cpu", "cuda")  # where the row means something


@dataclasses.dataclass
class Row:
    """One line of the results table (times in milliseconds, memory in MiB)."""

    model: str
    mode: str
    backend: str
    status: str = "ok"
    error: str | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    mean_ms: float | None = None
    min_ms: float | None = None
    calls: int = 0
    first_call_s: float | None = None
    peak_mib: float | None = None
    retained_mib: float | None = None
    max_abs_diff: float | None = None
    #: max |output - eager's| / max |eager's output|
    max_rel_diff: float | None = None
    vs_eager: float | None = None
    vs_floor: float | None = None
    vs_inductor: float | None = None
    #: median over the best direct ORT run's median (``best-ort``)
    vs_best: float | None = None
    #: reduced-precision and fast_math rows: median over the exact fp32 ``ort`` row's median
    vs_ort: float | None = None
    #: mixed-regime rows: (median - the PyTorch matmul's time alone) / the backend's median alone
    mixed_penalty: float | None = None
    first_vs_inductor: float | None = None
    #: (first call - dynamo's first call) / (Inductor's first call - dynamo's first call):
    #: the backend's own compile time against Inductor's, without the trace both share
    compile_vs_inductor: float | None = None
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- steps


def _loss(out: Any) -> torch.Tensor:
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().square().mean()


def _train_step(fn: Callable[..., Any], model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """forward, loss, backward, SGD step (inputs need grad when the model has no parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        args = tuple(inputs)
        opt: torch.optim.Optimizer | None = torch.optim.SGD(params, lr=1e-4)
    else:
        args = tuple(x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs)
        opt = None
    leaves = [a for a in args if a.requires_grad]

    def step() -> torch.Tensor:
        loss = _loss(fn(*args))
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for leaf in leaves:
            leaf.grad = None
        return loss.detach()

    return step


def _make_step(case: Case, fn: Callable[..., Any], model: torch.nn.Module) -> Callable[[], Any]:
    if case.train:
        return _train_step(fn, model, case.inputs)
    inputs = case.inputs
    return lambda: fn(*inputs)


def _first_call(case: Case, step: Callable[[], Any]) -> tuple[float, Any]:
    with _grad_mode(case.train):
        start = time.perf_counter()
        out = step()
        if case.device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    return elapsed, out


def _grad_mode(train: bool) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext() if train else torch.no_grad()


# ----------------------------------------------------------------------------- backends


def _build_eager(case: Case) -> Prepared:
    model = case.fresh_model()
    step = _make_step(case, model, model)
    first, out = _first_call(case, step)
    return Prepared(step, first, out)


def _build_compiled(case: Case, **compile_kwargs: Any) -> Prepared:
    """``torch.compile(model, **compile_kwargs)``: Inductor by default; ``backend="eager"`` is
    dynamo's own cost (tracing, guards), shared by every backend."""
    model = case.fresh_model()
    compiled = torch.compile(model, **compile_kwargs)
    step = _make_step(case, compiled, model)
    first, out = _first_call(case, step)
    return Prepared(step, first, out)


def _ort_counters() -> dict[str, int]:
    from ort_lazy import metrics

    return metrics.counters()


def _build_ort(case: Case, freeze: bool = False, precision: str | None = None, fast_math: bool = False) -> Prepared:
    model = case.fresh_model()
    options = dict(case.ort_options)
    if freeze:
        options["freeze_weights"] = True
    if precision is not None:
        options["precision"] = precision
    if fast_math:
        options["fast_math"] = True
    compiled = torch.compile(model, backend="ort", options=options)
    step = _make_step(case, compiled, model)
    before = _ort_counters()
    first, out = _first_call(case, step)
    after = _ort_counters()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    keep = ("regions_on_ort", "fallback_regions", "fallback_ops", "export_failures", "ort_failures")
    extra = {k: delta.get(k, 0) for k in keep}
    note = f"regions={extra['regions_on_ort']}"
    if extra["fallback_ops"]:
        note += f" fallback_ops={extra['fallback_ops']}"
    if extra["ort_failures"] or extra["export_failures"]:
        note += f" failures={extra['ort_failures'] + extra['export_failures']}"
    return Prepared(step, first, out, note=note, extra=extra)


def _build_best_ort(case: Case) -> Prepared:
    """``torch.onnx.export(dynamo=True, optimize=True)``, default ORT options, IOBinding."""
    if case.train:
        raise ValueError("the best ORT run is measured for inference only")
    start = time.perf_counter()
    runner = export_floor(case.fresh_model(), case.inputs, case.threads, optimize=True, default_options=True)
    runner()
    first = time.perf_counter() - start
    outs = runner.outputs()
    return Prepared(runner, first, outs[0] if len(outs) == 1 else None, note="torch.onnx.export(dynamo=True, optimize=True)")


def _build_dynamo_best_ort(case: Case) -> Prepared:
    """``torch.compile`` with :func:`_floor.least_backend` over the best direct ORT run's session."""
    if case.train:
        raise ValueError("the best ORT run is measured for inference only")
    model = case.fresh_model()
    runner = export_floor(case.fresh_model(), case.inputs, case.threads, optimize=True, default_options=True)
    step = _make_step(case, torch.compile(model, backend=least_backend(runner, case.inputs)), model)
    first, out = _first_call(case, step)
    return Prepared(step, first, out, note="torch.compile, binding and running best-ort's session")


def _mixed(build: Callable[[Case], Prepared]) -> Callable[[Case], Prepared]:
    """A row of ``build``'s backend whose every call follows one PyTorch matmul."""

    def build_mixed(case: Case) -> Prepared:
        p = build(case)
        a = torch.randn(MIXED_MM, MIXED_MM)
        b = torch.randn(MIXED_MM, MIXED_MM)
        work = torch.empty(MIXED_MM, MIXED_MM)
        inner = p.step
        # the matmul's own time, taken inside the very calls the row times (a separate
        # measurement on a shared machine can exceed the whole call's and make the penalty < 0)
        pre_samples: list[float] = []

        def step() -> Any:
            t0 = time.perf_counter()
            torch.mm(a, b, out=work)
            pre_samples.append(time.perf_counter() - t0)
            return inner()

        note = f"after a {MIXED_MM}x{MIXED_MM} torch matmul"
        return Prepared(step, p.first_call_s, p.output, note=note, extra={**p.extra, "pre_samples": pre_samples})

    return build_mixed


def _build_floor(case: Case, freeze: bool = False) -> Prepared:
    if case.train:
        raise ValueError("the floor is measured for inference only")
    options = dict(case.ort_options)
    if freeze:
        options["freeze_weights"] = True
    source = "ort-lazy graph"
    error = None
    try:
        calls = capture_regions(case.fresh_model(), case.inputs, options)
        if not calls:
            raise RuntimeError("ort-lazy ran no ORT region")
    except Exception as e:  # the floor still exists when ort-lazy fails: export it directly
        error = f"{type(e).__name__}: {e}"
        calls = []
    start = time.perf_counter()
    if calls:
        runner = FloorRunner(calls)
    else:
        source = "torch.onnx.export"
        runner = export_floor(case.fresh_model(), case.inputs, case.threads)
    runner()
    first = time.perf_counter() - start
    out = runner.outputs()[0] if runner.regions == 1 and len(runner.outputs()) == 1 else None
    note = f"{source}, regions={runner.regions}"
    if error:
        note += f" (capture failed: {error[:120]})"
    return Prepared(runner, first, out, note=note, extra={"floor_source": source, "regions": runner.regions})


#: Every backend the suite knows; tests may add their own.
BACKENDS: dict[str, Backend] = {
    "eager": Backend("eager", MODES, _build_eager),
    "dynamo": Backend("dynamo", MODES, lambda c: _build_compiled(c, backend="eager")),
    "inductor": Backend("inductor", MODES, _build_compiled),
    "aot-eager": Backend("aot-eager", ("train",), lambda c: _build_compiled(c, backend="aot_eager")),
    "ort": Backend("ort", MODES, _build_ort, floor_of={"inference": "floor", "train": "aot-eager"}),
    "ort+freeze": Backend(
        "ort+freeze", ("inference",), lambda c: _build_ort(c, freeze=True), floor_of={"inference": "floor+freeze"}
    ),
    "floor": Backend("floor", ("inference",), _build_floor),
    "floor+freeze": Backend("floor+freeze", ("inference",), lambda c: _build_floor(c, freeze=True)),
    "best-ort": Backend("best-ort", ("inference",), _build_best_ort),
    "dynamo+best-ort": Backend("dynamo+best-ort", ("inference",), _build_dynamo_best_ort),
    "ort-int8": Backend(
        "ort-int8", ("inference",), lambda c: _build_ort(c, precision="int8-dynamic"), reduced=True, devices=("cpu",)
    ),
    "ort-fast": Backend("ort-fast", MODES, lambda c: _build_ort(c, fast_math=True), reduced=True),
    # ORT's CPU provider has no float16 matrix kernels (regions stay float32 there)
    "ort-fp16": Backend("ort-fp16", ("inference",), lambda c: _build_ort(c, precision="fp16"), reduced=True, devices=("cuda",)),
    "eager-mixed": Backend("eager-mixed", MODES, _mixed(_build_eager), alone="eager", devices=("cpu",)),
    "ort-mixed": Backend("ort-mixed", MODES, _mixed(_build_ort), alone="ort", devices=("cpu",)),
}


# ----------------------------------------------------------------------------- memory


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return 4096


class _Rss:
    """Reads this process's resident set size (Linux ``/proc/self/statm``; else unavailable)."""

    def __init__(self) -> None:
        self._page = _page_size()
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
        try:
            self._trim: Any = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None

    @property
    def available(self) -> bool:
        """Whether RSS can be read here."""
        return self._fd is not None

    def read(self) -> int:
        """Resident bytes now."""
        assert self._fd is not None
        fields = os.pread(self._fd, 128, 0).split()
        return int(fields[1]) * self._page

    def settle(self) -> int:
        """Collect garbage, give freed heap back to the OS, and return the RSS after that."""
        gc.collect()
        if self._trim is not None:
            self._trim(0)
        return self.read()

    @contextlib.contextmanager
    def peak(self, interval_s: float = 0.0002) -> Iterator[list[int]]:
        """Sample RSS in a thread while the body runs; yields a list that gets ``[peak]``."""
        result: list[int] = []
        stop = threading.Event()
        samples = [self.read()]

        def sample() -> None:
            best = samples[0]
            while not stop.is_set():
                best = max(best, self.read())
                time.sleep(interval_s)
            samples.append(best)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield result
        finally:
            stop.set()
            thread.join()
            result.append(max(max(samples), self.read()))


# ----------------------------------------------------------------------------- running


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()


@contextlib.contextmanager
def _torch_configured(inductor_cache: bool) -> Iterator[None]:
    """torch set up for the run, restored after it: dynamo's recompile limits raised (every
    model and mode recompiles) and, unless ``inductor_cache``, Inductor's caches off in a
    private directory (so its first call is cold). Nothing leaks into the caller's process."""
    import shutil
    import tempfile

    import torch._dynamo

    saved: list[tuple[Any, str, Any]] = []

    def set_(obj: Any, name: str, value: Any) -> None:
        if hasattr(obj, name):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            set_(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    env_before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    private_dir = None
    if not inductor_cache:
        # A private, empty cache directory: kernels compiled by an earlier run are not reused.
        private_dir = tempfile.mkdtemp(prefix="ort-lazy-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = private_dir
        with contextlib.suppress(Exception):
            import torch._inductor.config as inductor_config

            set_(inductor_config, "fx_graph_cache", False)
            set_(inductor_config, "force_disable_caches", True)
        with contextlib.suppress(Exception):
            import torch._functorch.config as functorch_config

            set_(functorch_config, "enable_autograd_cache", False)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        if private_dir is not None:
            if env_before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = env_before
            shutil.rmtree(private_dir, ignore_errors=True)


def _prime(backends: Sequence[str], ort_options: dict[str, Any], log: Callable[[str], None]) -> dict[str, float]:
    """Compile a tiny model once per compiling backend so one-time imports are not billed to
    the first real model's first call."""
    times: dict[str, float] = {}
    tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    makers: dict[str, Callable[[torch.nn.Module], Any]] = {
        "inductor": lambda m: torch.compile(m),
        "dynamo": lambda m: torch.compile(m, backend="eager"),
        "ort": lambda m: torch.compile(m, backend="ort", options=dict(ort_options)),
    }
    for name, make in makers.items():
        needed = any(b.startswith("ort") or b.startswith("floor") for b in backends) if name == "ort" else name in backends
        if not needed:
            continue
        start = time.perf_counter()
        try:
            model = copy.deepcopy(tiny)
            compiled = make(model)
            with torch.no_grad():
                compiled(x)
            compiled(x).sum().backward()
        except Exception as e:
            log(f"  priming {name} failed: {_error_text(e)}")
        times[name] = time.perf_counter() - start
        torch._dynamo.reset()
    return times


def _time_calls(step: Callable[[], Any], n: int, train: bool, out: list[float]) -> None:
    clock = time.perf_counter
    with _grad_mode(train):
        for _ in range(n):
            start = clock()
            step()
            out.append(clock() - start)


def _synchronized(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` followed by a wait for the GPU: a timed call covers the kernels it queued."""

    def call() -> Any:
        out = step()
        torch.cuda.synchronize()
        return out

    return call


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _first(out: Any) -> Any:
    """A step's output, or its first element when it returns several."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _max_abs_diff(a: Any, b: Any) -> float | None:
    a, b = _first(a), _first(b)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return None
    diff = (a.detach().double() - b.detach().double()).abs()
    return float(diff.max()) if diff.numel() else 0.0


def run_case(
    case: Case,
    backends: Sequence[str],
    *,
    reps: int,
    warmup: int,
    rounds: int,
    max_time_s: float,
    memory: bool,
    rss: _Rss,
    log: Callable[[str], None],
    pause_s: float = 0.05,
) -> list[Row]:
    """Build, warm up and time every backend on one model in one mode; one :class:`Row` each."""
    rows: list[Row] = []
    prepared: dict[str, Prepared] = {}
    per_call: dict[str, float] = {}
    for name in backends:
        backend = BACKENDS[name]
        if case.mode not in backend.modes:
            continue
        row = Row(case.model_name, case.mode, name)
        rows.append(row)
        base = rss.settle() if rss.available else 0
        stage = "build"
        try:
            if case.device not in backend.devices:
                raise ValueError(f"{name} is measured on {' and '.join(backend.devices)} only")
            p = backend.build(case)
            if case.device == "cuda":
                p.step = _synchronized(p.step)
            row.first_call_s = p.first_call_s
            row.note = p.note
            row.extra.update(p.extra)
            # Warm up; the warm-up also estimates the cost of a call for the time budget.
            stage = "warm-up"
            samples: list[float] = []
            _time_calls(p.step, max(1, warmup), case.train, samples)
        except Exception as e:
            row.status = "error"
            row.error = _error_text(e)
            row.extra["traceback"] = traceback.format_exc(limit=8)
            log(f"  {case.model_name}/{case.mode}/{name}: ERROR ({stage}) {row.error[:200]}")
            continue
        prepared[name] = p
        per_call[name] = statistics.median(samples[-max(1, warmup // 2):])
        if rss.available:
            row.retained_mib = max(0, rss.settle() - base) / 2**20
        log(f"  {case.model_name}/{case.mode}/{name}: first call {p.first_call_s:.3f} s, "
            f"~{per_call[name] * 1e3:.3f} ms/call {p.note}")

    by_name = {r.backend: r for r in rows}
    eager = prepared.get("eager")
    for name, p in prepared.items():
        if eager is not None and name != "eager":
            row = by_name[name]
            row.max_abs_diff = _max_abs_diff(p.output, eager.output)
            reference = _first(eager.output)
            scale = _max_abs_diff(reference, torch.zeros_like(reference)) if isinstance(reference, torch.Tensor) else None
            if row.max_abs_diff is not None and scale:
                row.max_rel_diff = row.max_abs_diff / scale
    if not prepared:
        return rows
    total_est = sum(per_call.values())
    n = max(min(reps, 5), min(reps, int(max_time_s * len(per_call) / max(total_est, 1e-9))))
    rounds = max(1, min(rounds, n))
    chunk = max(1, math.ceil(n / rounds))
    times: dict[str, list[float]] = {name: [] for name in prepared}
    for _ in range(rounds):
        for name, p in list(prepared.items()):
            # Untimed pause: worker threads of the previous row (ORT's spinning pool, OpenMP)
            # go idle before this row's calls are timed.
            time.sleep(pause_s)
            try:
                _time_calls(p.step, chunk, case.train, times[name])
            except Exception as e:
                row = by_name[name]
                row.status, row.error = "error", _error_text(e)
                row.extra["traceback"] = traceback.format_exc(limit=8)
                del prepared[name]
    for name, samples in times.items():
        row = by_name[name]
        if row.status != "ok" or not samples:
            continue
        row.calls = len(samples)
        row.median_ms = statistics.median(samples) * 1e3
        pre = row.extra.pop("pre_samples", None)
        if pre:  # a mixed row: its matmul's time in the timed calls
            row.extra["pre_ms"] = statistics.median(pre[-len(samples):]) * 1e3
            row.note += f" ({row.extra['pre_ms']:.3f} ms of it)"
        row.p90_ms = _percentile(samples, 0.9) * 1e3
        row.mean_ms = statistics.fmean(samples) * 1e3
        row.min_ms = min(samples) * 1e3

    if memory and rss.available:
        for name, p in prepared.items():
            row = by_name[name]
            try:
                base = rss.settle()
                with _grad_mode(case.train), rss.peak() as peak:
                    for _ in range(3):
                        p.step()
                row.extra["call_peak_mib"] = max(0, peak[0] - base) / 2**20
                row.peak_mib = row.extra["call_peak_mib"] + (row.retained_mib or 0.0)
            except Exception as e:  # memory is a figure, not a reason to lose the row
                row.extra["memory_error"] = _error_text(e)
    prepared.clear()
    gc.collect()
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def add_ratios(rows: Sequence[Row]) -> None:
    """Fill ``vs_eager``, ``vs_floor``, ``vs_inductor``, ``vs_best``, ``mixed_penalty``,
    ``first_vs_inductor`` and ``compile_vs_inductor`` in place."""
    groups: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.mode), {})[r.backend] = r
    for group in groups.values():
        eager, inductor, dynamo = group.get("eager"), group.get("inductor"), group.get("dynamo")
        best, ort = group.get("best-ort"), group.get("ort")
        for r in group.values():
            if r.status != "ok":
                continue
            if best is not None and best.status == "ok" and r is not best:
                r.vs_best = _ratio(r.median_ms, best.median_ms)
            spec = BACKENDS.get(r.backend)
            alone = group.get(spec.alone) if spec is not None and spec.alone else None
            if alone is not None and alone.status == "ok" and r.median_ms is not None:
                r.mixed_penalty = _ratio(r.median_ms - r.extra.get("pre_ms", 0.0), alone.median_ms)
                if r.mixed_penalty is not None:
                    r.note += f", penalty {r.mixed_penalty:.2f}x"
            if eager is not None and r is not eager:
                r.vs_eager = _ratio(r.median_ms, eager.median_ms)
            if spec is not None and spec.reduced and ort is not None and ort.status == "ok":
                r.vs_ort = _ratio(r.median_ms, ort.median_ms)
                if r.vs_ort is not None:
                    r.note += f"{', ' if r.note else ''}{1 / r.vs_ort:.2f}x fp32 ort's speed"
                if r.max_rel_diff is not None:
                    r.note += f", max rel error {r.max_rel_diff:.2%}"
            if inductor is not None and r is not inductor:
                r.vs_inductor = _ratio(r.median_ms, inductor.median_ms)
                r.first_vs_inductor = _ratio(r.first_call_s, inductor.first_call_s)
                compiles = r.backend not in ("eager", "dynamo") and not r.backend.startswith("floor")
                if compiles and dynamo is not None and dynamo.status == "ok" and inductor.status == "ok":
                    own = (r.first_call_s or 0.0) - (dynamo.first_call_s or 0.0)
                    r.compile_vs_inductor = _ratio(max(own, 0.0), (inductor.first_call_s or 0.0) - (dynamo.first_call_s or 0.0))
            backend = BACKENDS.get(r.backend)
            floor_name = backend.floor_of.get(r.mode) if backend is not None else None
            floor = group.get(floor_name) if floor_name else None
            if floor is not None and floor.status == "ok":
                r.vs_floor = _ratio(r.median_ms, floor.median_ms)


# ----------------------------------------------------------------------------- targets


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal for one ratio of one row: ``row.<field> <= limit``."""

    label: str
    model: str
    mode: str
    backend: str
    field: str
    limit: float


#: The project's targets (2-core CPU, fp32), checked and reported; never asserted in tests.
TARGETS: tuple[Target, ...] = (
    Target("TransformerEncoderLayer inference vs eager", "transformer", "inference", "ort", "vs_eager", 0.60),
    Target("TransformerEncoderLayer inference vs raw ORT floor", "transformer", "inference", "ort", "vs_floor", 1.02),
    Target("TransformerEncoderLayer inference vs best ORT run", "transformer", "inference", "ort", "vs_best", 1.10),
    Target("MLP inference vs best ORT run", "mlp", "inference", "ort", "vs_best", 1.50),
    # ort-lazy's own per-call cost: against torch.compile with the least backend on ORT
    Target("MLP inference vs the least torch.compile backend on ORT", "mlp", "inference", "ort", "vs_least", 1.10),
    Target("Mixed regime penalty (TransformerEncoderLayer after a torch matmul)", "transformer", "inference", "ort-mixed", "mixed_penalty", 1.15),
    *(Target(f"{m} inference vs best ORT run", m, "inference", "ort", "vs_best", 1.10) for m in ("bert", "gpt2", "resnet", "vit")),
    *(Target(f"Training step ({m}) vs eager", m, "train", "ort", "vs_eager", 1.00) for m in ("bert", "gpt2", "resnet", "vit")),
    *(Target(f"precision int8-dynamic ({m}) vs fp32 ort-lazy", m, "inference", "ort-int8", "vs_ort", 0.50) for m in ("ffn", "bert")),
    Target("MLP inference vs eager", "mlp", "inference", "ort", "vs_eager", 0.60),
    Target("MLP inference vs raw ORT floor", "mlp", "inference", "ort", "vs_floor", 1.30),
    Target("Training step (TransformerEncoderLayer) vs eager", "transformer", "train", "ort", "vs_eager", 0.90),
    Target("Training step (MLP) vs eager", "mlp", "train", "ort", "vs_eager", 1.00),
    *(
        Target(f"Training step ({m}) vs dynamo+AOTAutograd with PyTorch's kernels", m, "train", "ort", "vs_floor", 1.00)
        for m in ("mlp", "transformer", "resnet", "bert", "gpt2", "vit")
    ),
    Target("First call vs Inductor's first call (transformer inference)", "transformer", "inference", "ort", "first_vs_inductor", 0.05),
    Target("First call vs Inductor's first call (mlp inference)", "mlp", "inference", "ort", "first_vs_inductor", 0.05),
    Target("First call vs Inductor's first call (transformer train)", "transformer", "train", "ort", "first_vs_inductor", 0.05),
    Target("First call vs Inductor's first call (mlp train)", "mlp", "train", "ort", "first_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (transformer inference)", "transformer", "inference", "ort", "compile_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (mlp inference)", "mlp", "inference", "ort", "compile_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (transformer train)", "transformer", "train", "ort", "compile_vs_inductor", 0.05),
    Target("Compile time beyond dynamo's trace vs Inductor's (mlp train)", "mlp", "train", "ort", "compile_vs_inductor", 0.05),
    Target("Peak memory, TransformerEncoderLayer inference vs eager", "transformer", "inference", "ort", "peak_vs_eager", 1.20),
)


def check_targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each target whose row was measured, with its value and whether it is met."""
    index = {(r.model, r.mode, r.backend): r for r in rows}
    out = []
    for t in TARGETS:
        row = index.get((t.model, t.mode, t.backend))
        if row is None or row.status != "ok":
            continue
        if t.field == "peak_vs_eager":
            eager = index.get((t.model, t.mode, "eager"))
            value = _ratio(row.peak_mib, eager.peak_mib if eager else None)
        elif t.field == "vs_least":
            least = index.get((t.model, t.mode, "dynamo+best-ort"))
            value = _ratio(row.median_ms, least.median_ms if least and least.status == "ok" else None)
        else:
            value = getattr(row, t.field)
        if value is None:
            continue
        out.append({"target": t.label, "value": value, "limit": t.limit, "met": value <= t.limit})
    return out


# ----------------------------------------------------------------------------- output


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec) + suffix


def format_table(rows: Sequence[Row]) -> str:
    """The results as a fixed-width text table."""
    header = ("model", "mode", "backend", "median ms", "p90 ms", "first s", "peak MiB",
              "x eager", "x floor", "x best", "x induct", "1st/ind", "cmp/ind", "max|diff|", "notes")
    lines = []
    for r in rows:
        if r.status != "ok":
            lines.append((r.model, r.mode, r.backend, "-", "-", _fmt(r.first_call_s, ".3f"), "-", "-", "-", "-", "-", "-", "-", "-",
                          f"ERROR {(r.error or '')[:90]}"))
            continue
        lines.append((
            r.model, r.mode, r.backend,
            _fmt(r.median_ms, ".3f"), _fmt(r.p90_ms, ".3f"), _fmt(r.first_call_s, ".3f"), _fmt(r.peak_mib, ".1f"),
            _fmt(r.vs_eager, ".2f", "x"), _fmt(r.vs_floor, ".2f", "x"), _fmt(r.vs_best, ".2f", "x"), _fmt(r.vs_inductor, ".2f", "x"),
            _fmt(r.first_vs_inductor, ".3f", "x"), _fmt(r.compile_vs_inductor, ".3f", "x"), _fmt(r.max_abs_diff, ".1e"), r.note,
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    right = set(range(3, 14))

    def render(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    out = [render(header), render(["-" * w for w in widths])]
    out += [render(line) for line in lines]
    return "\n".join(out)


def format_targets(results: Sequence[dict[str, Any]], informational: bool = False) -> str:
    """The target check as text lines; ``informational`` (``--quick``: too few calls to judge
    speed) shows each value against its target without a verdict."""
    if not results:
        return "targets: none measured (needs the mlp/transformer rows with eager, ort, floor, inductor)"
    if informational:
        lines = ["targets (informational only: --quick times too few calls to judge them):"]
    else:
        lines = ["targets:"]
    for t in results:
        mark = "info" if informational else ("met " if t["met"] else "MISS")
        lines.append(f"  [{mark}] {t['target']}: {t['value']:.3f} (target <= {t['limit']:.2f})")
    return "\n".join(lines)


def write_png(rows: Sequence[Row], path: Path) -> bool:
    """A bar chart of each row's time ratios (vs eager, and vs the floor); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups: list[tuple[str, str]] = []
    for r in rows:
        if (r.model, r.mode) not in groups:
            groups.append((r.model, r.mode))
    backends = [b for b in dict.fromkeys(r.backend for r in rows) if b != "eager"]
    index = {(r.model, r.mode, r.backend): r for r in rows}
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 1.1 * len(groups) + 3), 8), constrained_layout=True)
    panels = (("vs_eager", "time / eager (lower is faster)"), ("vs_best", "time / best direct ORT run"))
    width = 0.8 / max(1, len(backends))
    labels = [f"{m}\n{mode}" for m, mode in groups]
    for ax, (field, title) in zip(axes, panels):
        for j, backend in enumerate(backends):
            values = []
            for model, mode in groups:
                row = index.get((model, mode, backend))
                value = getattr(row, field) if row is not None and row.status == "ok" else None
                values.append(value if value is not None else float("nan"))
            if all(math.isnan(v) for v in values):
                continue
            xs = [i + (j - (len(backends) - 1) / 2) * width for i in range(len(groups))]
            # one colour per backend in both panels (a panel skips the backends it has no ratio for)
            bars = ax.bar(xs, values, width, label=backend, color=f"C{j % 10}")
            for bar, v in zip(bars, values):
                if not math.isnan(v):
                    ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels)
        ax.set_title(title)
        ax.set_yscale("log")
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8)
    fig.suptitle("ort-lazy benchmark: median time per call as a ratio")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    with contextlib.suppress(Exception):
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    with contextlib.suppress(Exception):
        import ort_lazy

        out["ort_lazy"] = ort_lazy.__version__
    return out


# ----------------------------------------------------------------------------- CLI


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of the suite."""
    p = argparse.ArgumentParser(
        prog="ort-lazy bench",
        description="Eager PyTorch vs Inductor vs torch.compile(backend='ort') vs the raw ORT floor, side by side.",
    )
    from ort_lazy.models import BUILTIN

    p.add_argument("--models", default=",".join(BUILTIN),
                   help=f"comma-separated, from: {', '.join(known_models())} (default: the built-ins)")
    p.add_argument("--modes", default=",".join(MODES), help="inference, train or both (comma-separated)")
    p.add_argument("--backends", default=None,
                   help=f"comma-separated, from: {', '.join(BACKENDS)} (default: {', '.join(DEFAULT_BACKENDS)}, "
                   "less the CPU-only rows and with ort-fp16 on --device cuda; --freeze adds the +freeze rows)")
    p.add_argument("--reps", type=int, default=200, help="timed calls per row (fewer if --max-time runs out)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls per row after the first call")
    p.add_argument("--rounds", type=int, default=10, help="timed calls are interleaved across rows in this many rounds")
    p.add_argument("--max-time", type=float, default=5.0, help="seconds of timed calls per row, about (at least 5 calls)")
    p.add_argument("--pause-ms", type=float, default=50.0,
                   help="untimed pause before each row's share of a round, so the previous row's threads go idle")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads and ORT intra-op threads (default: torch's current count)")
    p.add_argument("--freeze", action="store_true", help="add ort+freeze (freeze_weights=True) and floor+freeze rows for inference")
    p.add_argument("--quick", action="store_true", help="few calls, for smoke tests (reps 20, warm-up 3, 2 rounds, 1 s)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument("--inductor-cache", action="store_true", help="leave Inductor's on-disk caches on (first call no longer cold)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed for weights and inputs")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where models and inputs live (cuda: ORT's CUDA provider; each timed call waits for the GPU; "
                   "the mixed-regime and int8 rows are CPU-only, the fp16 row GPU-only)")
    p.add_argument("--json", dest="json_path", default="bench-results.json", help="JSON output path ('' to skip)")
    p.add_argument("--png", dest="png_path", default="bench-results.png", help="PNG chart path ('' to skip)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the table and targets")
    return p


def default_backends(device: str) -> list[str]:
    """The rows run without ``--backends``: those of :data:`DEFAULT_BACKENDS` measured on
    ``device``, and on a GPU its reduced precision (``ort-fp16``)."""
    rows = [b for b in DEFAULT_BACKENDS if device in BACKENDS[b].devices]
    return rows + (["ort-fp16"] if device == "cuda" else [])


def run_suite(args: argparse.Namespace, log: Callable[[str], None]) -> tuple[list[Row], dict[str, Any]]:
    """Run every selected model, mode and backend; the rows (ratios filled) and run metadata."""
    models = _csv(args.models)
    modes = _csv(args.modes)
    backends = _csv(args.backends) if args.backends else default_backends(args.device)
    if args.freeze:
        backends += [b for b in ("ort+freeze", "floor+freeze") if b not in backends]
    for kind, chosen, known in (("model", models, known_models()), ("mode", modes, MODES), ("backend", backends, BACKENDS)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise SystemExit(f"unknown {kind}(s) {unknown}; choose from {', '.join(known)}")
    threads_before = torch.get_num_threads()
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    # ort-lazy follows torch's thread count itself (and uses one thread for small regions)
    ort_options: dict[str, Any] = {}
    try:
        with _torch_configured(args.inductor_cache):
            return _run_models(args, models, modes, backends, threads, ort_options, log)
    finally:
        torch.set_num_threads(threads_before)


def _run_models(
    args: argparse.Namespace,
    models: list[str],
    modes: list[str],
    backends: list[str],
    threads: int,
    ort_options: dict[str, Any],
    log: Callable[[str], None],
) -> tuple[list[Row], dict[str, Any]]:
    catalogue = known_models()
    rss = _Rss()
    started = time.perf_counter()
    prime = _prime(backends, ort_options, log)
    rows: list[Row] = []
    for model_name in models:
        spec = catalogue[model_name]
        torch.manual_seed(args.seed)
        template = spec.make().to(args.device)
        inputs = tuple(t.to(args.device) for t in spec.inputs())
        for mode in modes:
            log(f"{model_name} / {mode}")
            torch._dynamo.reset()
            case = Case(model_name, mode, template, inputs, threads, ort_options, args.device)
            rows += run_case(
                case, backends, reps=args.reps, warmup=args.warmup, rounds=args.rounds,
                max_time_s=args.max_time, memory=not args.no_memory, rss=rss, log=log,
                pause_s=args.pause_ms / 1e3,
            )
            torch._dynamo.reset()
    add_ratios(rows)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": args.device if args.device == "cpu" else f"{args.device}: {torch.cuda.get_device_name()}",
        "threads": threads,
        "ort_options": ort_options,
        "reps": args.reps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "pause_ms": args.pause_ms,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "max_time_s": args.max_time,
        "models": models,
        "modes": modes,
        "backends": backends,
        "inductor_cache": bool(args.inductor_cache),
        "prime_s": prime,
        "wall_s": time.perf_counter() - started,
        "memory_method": "peak_mib = retained_mib (RSS growth from before the row was built to after its "
        "warm-up) + extra.call_peak_mib (peak RSS above the pre-call RSS over 3 steady-state calls, sampled "
        "every 0.2 ms from /proc/self/statm); readings after gc.collect() and malloc_trim(0)"
        if rss.available else "unavailable on this platform",
        "time_unit": "ms per call (median and p90 over the timed calls, after warm-up)",
    }
    return rows, meta


def main(argv: list[str] | None = None) -> int:
    """Run the suite; print the table, write JSON and PNG.

    Returns 0 when every row ran, 1 when some row failed (its error is in the table and JSON).
    """
    args = build_parser().parse_args(argv)
    if args.quick:
        args.reps, args.warmup, args.rounds, args.max_time = min(args.reps, 20), min(args.warmup, 3), 2, 1.0

    def log(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, meta = run_suite(args, log)
    targets = check_targets(rows)
    print(format_table(rows))
    print()
    print(format_targets(targets, informational=args.quick))
    print(f"threads={meta['threads']}  torch {meta['versions'].get('torch')}  onnxruntime "
          f"{meta['versions'].get('onnxruntime')}  wall {meta['wall_s']:.0f} s  load average "
          f"{' '.join(f'{x:.1f}' for x in meta['load_average'] or [])}")
    if args.json_path:
        path = Path(args.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"meta": {**meta, "quick": bool(args.quick)}, "rows": [dataclasses.asdict(r) for r in rows], "targets": targets}
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"JSON: {path}")
    if args.png_path:
        path = Path(args.png_path)
        if write_png(rows, path):
            print(f"chart: {path}")
        else:
            print("chart: skipped (matplotlib is not installed: pip install matplotlib)")
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

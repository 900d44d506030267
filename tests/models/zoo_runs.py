"""One inference run and one training step per zoo model, eager and through ``backend="ort"``.

Each run is made once per process and cached: the tests of a model (parity, share of ops on
ORT) assert on the same compiled run instead of compiling the model again. A run that raised
keeps the exception; the tests re-raise it, so a compile crash fails every test of the model
with the original error.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from zoo import CASES, ModelCase, outputs_of

from helpers import captured_exports, growth
from ort_lazy import metrics
from ort_lazy.debug.records import ExplainReport, recording


@dataclass
class Share:
    """Ops the partitioner saw in the graphs of one kind (``forward`` ...), and how many run on ORT."""

    on_ort: int = 0
    total: int = 0

    @property
    def ratio(self) -> float:
        return self.on_ort / self.total if self.total else 0.0

    def __str__(self) -> str:
        return f"{self.ratio:.1%} ({self.on_ort}/{self.total})"


@dataclass
class Run:
    """What one eager-vs-ort-lazy run measured; ``error`` holds the exception when it raised."""

    name: str
    error: BaseException | None = None
    counters: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, dict[str, int]] = field(default_factory=dict)
    shares: dict[str, Share] = field(default_factory=dict)
    report: str = ""
    eager_ms: float = float("nan")
    ort_ms: float = float("nan")
    first_call_s: float = float("nan")
    #: the models ort-lazy exported during the compiled run
    exported: list[Any] = field(default_factory=list)

    def growth(self) -> list[tuple[float, int, str, str]]:
        """Per exported model: :func:`helpers.growth` (its largest tensor over its largest input,
        weight or output, that tensor's size and op type) and the model's name; computed when
        asked (ONNX shape inference), not for every run."""
        return [(*growth(m.model_bytes), m.name) for m in self.exported]

    def check(self) -> None:
        """Re-raise the run's exception (the same object, so pytest's ``raises`` sees its type)."""
        if self.error is not None:
            raise self.error

    @property
    def share(self) -> Share:
        total = Share()
        for s in self.shares.values():
            total.on_ort += s.on_ort
            total.total += s.total
        return total


@dataclass
class InferenceRun(Run):
    expected: list[torch.Tensor] = field(default_factory=list)
    actual: list[torch.Tensor] = field(default_factory=list)
    #: the float64 model's outputs (off the CPU only: the yardstick where eager itself rounds
    #: more, as with TF32 convolutions on a GPU)
    expected_f64: list[torch.Tensor] = field(default_factory=list)


@dataclass
class TrainingRun(Run):
    loss_eager: torch.Tensor | None = None
    loss_ort: torch.Tensor | None = None
    loss_f64: torch.Tensor | None = None  # the float64 model's loss (the accuracy yardstick)
    # parameter name -> gradient: eager fp32, ort-lazy fp32, eager float64 (the accuracy yardstick)
    grads_eager: dict[str, torch.Tensor] = field(default_factory=dict)
    grads_ort: dict[str, torch.Tensor] = field(default_factory=dict)
    grads_f64: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers_eager: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers_ort: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers_f64: dict[str, torch.Tensor] = field(default_factory=dict)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Eager PyTorch and ORT (which follows ``torch.get_num_threads()``) on one thread each.

    On a shared 2-core machine, two OpenMP threads make eager timings swing by 100x (a tiny
    BERT forward: 2 ms on one thread, 250 ms on two under load); one thread keeps the figures
    comparable and the tests fast.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _median_ms(fn: Callable[[], Any], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _shares(report: ExplainReport) -> dict[str, Share]:
    shares: dict[str, Share] = {}
    for graph in report.graphs:
        s = shares.setdefault(graph.tag, Share())
        s.total += len(graph.ops)
        s.on_ort += sum(1 for _, reason in graph.ops if reason is None)
    return shares


def _compiled_run(run: Run, body: Callable[[], None]) -> None:
    """Run ``body`` with fresh metrics and dynamo cache; record counters, fallbacks and shares."""
    metrics.reset()
    torch._dynamo.reset()
    try:
        with recording() as records, captured_exports() as models:
            body()
    except Exception as e:
        run.error = e
    run.exported = models
    report = ExplainReport(list(records))
    run.shares = _shares(report)
    run.report = str(report)
    run.counters = metrics.counters()
    run.fallbacks = metrics.fallbacks()
    torch._dynamo.reset()


def case_inputs(case: ModelCase, device: str = "cpu") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The case's inputs and training labels (seed 0), on ``device``."""
    gen = torch.Generator().manual_seed(0)
    inputs = {k: v.to(device) for k, v in case.inputs(gen).items()}
    return inputs, case.labels(gen).to(device)


@functools.cache
def inference(name: str, device: str = "cpu", options: tuple[tuple[str, Any], ...] = ()) -> InferenceRun:
    """Eval mode, no grad: eager outputs, ort-lazy outputs, timings (model and inputs on
    ``device``; ``options``: ort-lazy options as (name, value) pairs)."""
    with one_thread():
        return _inference(name, device, dict(options))


def _inference(name: str, device: str, options: dict[str, Any] | None = None) -> InferenceRun:
    case = CASES[name]
    run = InferenceRun(name)
    inputs, _ = case_inputs(case, device)
    model = case.model().eval().to(device)
    with torch.no_grad():
        run.expected = outputs_of(case, model(**inputs))
        if device != "cpu":
            run.expected_f64 = outputs_of(case, copy.deepcopy(model).double()(**floats_as(inputs, torch.float64)))
        run.eager_ms = _median_ms(lambda: model(**inputs))

    def body() -> None:
        compiled = torch.compile(model, backend="ort", options=options or None)
        with torch.no_grad():
            start = time.perf_counter()
            run.actual = outputs_of(case, compiled(**inputs))
            run.first_call_s = time.perf_counter() - start
            run.ort_ms = _median_ms(lambda: compiled(**inputs))

    _compiled_run(run, body)
    return run


def loss_of(out: Any) -> torch.Tensor:
    """The training loss of a step's output (a Hugging Face output's ``loss``, else the output)."""
    return out.loss if hasattr(out, "loss") else out


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _float_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()}


def floats_as(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``inputs`` with their floating-point tensors in ``dtype`` (others, such as token ids, as they are)."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


#: training options that put every op ORT can run on ORT, the gradients PyTorch runs faster by
#: default (``torch_preferred_ops``) included: the zoo verifies ORT's lowering of all of them
ALL_ON_ORT: tuple[tuple[str, Any], ...] = (("torch_preferred_ops", ()),)


@functools.cache
def training(
    name: str,
    options: tuple[tuple[str, Any], ...] = ALL_ON_ORT,
    device: str = "cpu",
    train_mode: bool = True,
    dtype: torch.dtype = torch.float32,
) -> TrainingRun:
    """One training step (loss inside the compiled function): loss and every gradient.

    ``options``: ort-lazy options as (name, value) pairs (``()``: the defaults); ``device``:
    where the model and its inputs live; ``train_mode`` False: the model in eval mode while its
    gradients are taken (fine-tuning with frozen batch norm and no dropout); ``dtype``: the
    model's and its inputs' floating-point type (float64: eager is its own yardstick)."""
    with one_thread():
        return _training(name, dict(options), device, train_mode, dtype)


def _training(
    name: str, options: dict[str, Any], device: str, train_mode: bool = True, dtype: torch.dtype = torch.float32
) -> TrainingRun:
    case = CASES[name]
    run = TrainingRun(name)
    inputs, labels = case_inputs(case, device)
    inputs = floats_as(inputs, dtype)
    eager = case.train_model().train(train_mode).to(device=device, dtype=dtype)
    ort_model = copy.deepcopy(eager)
    f64 = copy.deepcopy(eager).double()

    loss = loss_of(eager(**inputs, labels=labels))
    loss.backward()
    run.loss_eager = loss.detach()
    run.grads_eager = _grads(eager)
    run.buffers_eager = _float_buffers(eager)
    loss_f64 = loss_of(f64(**floats_as(inputs, torch.float64), labels=labels))
    loss_f64.backward()
    run.loss_f64 = loss_f64.detach()
    run.grads_f64 = _grads(f64)
    run.buffers_f64 = _float_buffers(f64)

    def eager_step() -> None:
        eager.zero_grad()
        loss_of(eager(**inputs, labels=labels)).backward()

    run.eager_ms = _median_ms(eager_step, repeat=3)

    def body() -> None:
        compiled = torch.compile(ort_model, backend="ort", options=options or None)
        start = time.perf_counter()
        loss = loss_of(compiled(**inputs, labels=labels))
        loss.backward()
        run.first_call_s = time.perf_counter() - start
        run.loss_ort = loss.detach()
        run.grads_ort = _grads(ort_model)
        run.buffers_ort = _float_buffers(ort_model)

        def ort_step() -> None:
            ort_model.zero_grad()
            loss_of(compiled(**inputs, labels=labels)).backward()

        run.ort_ms = _median_ms(ort_step, repeat=3)

    _compiled_run(run, body)
    return run


def grad_errors(run: TrainingRun) -> Iterator[tuple[str, float, float, float]]:
    """Per parameter: (name, |ort - eager|, |eager - float64|, max |eager|), max-norm over elements."""
    for name, g in run.grads_eager.items():
        ort = run.grads_ort.get(name)
        diff = float("inf") if ort is None or ort.shape != g.shape else float((ort - g).abs().max())
        eager_err = float((g.double() - run.grads_f64[name]).abs().max())
        yield name, diff, eager_err, float(g.abs().max())


def max_relative_grad_error(run: TrainingRun) -> float:
    """The largest max|ort - eager| / max|eager| over parameters whose gradient is not ~0.

    Parameters with an analytically zero gradient (a bias followed by a normalization) hold
    rounding noise only; they are left out of this figure (not out of the assertion).
    """
    scale = max((float(g.abs().max()) for g in run.grads_f64.values()), default=0.0)
    worst = 0.0
    for _, diff, _, size in grad_errors(run):
        if size > 1e-6 * scale:
            worst = max(worst, diff / size)
    return worst

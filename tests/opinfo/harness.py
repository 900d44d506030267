"""Run one OpInfo case through ``torch.compile(backend="ort")`` and say where and how it ran.

A case is (OpInfo + variant, dtype, direction):

- ``forward``: the op on samples that do not require grad (AOTAutograd's inference graph);
- ``backward``: float dtypes of ops that support autograd; the forward outputs and
  ``torch.autograd.grad`` of every input that requires grad, with a seeded random cotangent;
- ``no_grad``: the forward under ``torch.no_grad()`` for the same float ops (ort-lazy lowers
  such graphs without AOTAutograd).

Each sample runs in eager twice (different seeds: a sample whose result changes is
nondeterministic and skipped) and once compiled; outputs, gradients and the inputs after the
call (in-place mutation) are compared. A float32/float16/bfloat16 output or gradient beyond the
tolerance still matches when its error against a float64 run of eager is at most
:data:`ILL_CONDITIONED_FACTOR` times eager's own (an ill-conditioned computation, where eager is
no closer to the exact result: e.g. ``logcumsumexp``'s gradient, eager 2.2e-3 off in float32).
:func:`run_case` folds the samples into one status:
``ort``, ``fallback: <reason>``, ``wrong (<where>)``, ``crash (<error>)`` or ``skip: <why>``.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.utils._pytree as pytree

from ort_lazy import metrics
from ort_lazy.debug.records import GraphRecord, recording
from ort_lazy.reasons import Reason
from ort_lazy.runtime.session_cache import session_cache

from .selection import RANDOM_OPS, TIE_OPS, fast_cases
from .table import DIRECTIONS, DTYPES

__all__ = [
    "Case",
    "CaseResult",
    "RANDOM_OPS",
    "TOLERANCES",
    "all_cases",
    "run_flavour",
    "op_key",
    "opinfos",
    "run_case",
]

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")

#: (rtol, atol) per result dtype; atol is scaled by max(1, largest finite |expected|).
#: float64: PyTorch's assert_close default. float32: its default rtol (1.3e-6) loosened to 1e-5
#: for a different summation order and ORT's vectorised transcendental functions (a few ulp).
#: (Baseline: no passing case used more than half of its tolerance but three float16
#: grid_sample ones; the closest wrong case, a float64 vector_norm gradient, is off by 2.3e-7
#: relative, float32 precision; the others by far more, or in NaN/inf.)
#: float16/bfloat16: PyTorch's CPU kernels compute in float32 and round once, ORT (and the
#: decompositions it runs) may round after every step: several ulp (float16 ulp ~1e-3,
#: bfloat16 ulp ~8e-3) are allowed, i.e. 0.5% / 4% of the largest magnitude.
#: Integer and bool results are compared exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (4e-2, 4e-2),
}

#: Short, stable names of ort-lazy's fallback reasons (``ort_lazy.support.Reason``).
SHORT_REASONS = {
    Reason.NO_MAPPING: "no ONNX mapping",
    Reason.NO_KERNEL: "no ORT kernel",
    Reason.EXCLUDED: "excluded",
    Reason.EXPORT_FAILED: "export failed",
    Reason.ORT_FAILED: "ORT session failed",
    Reason.UNSUPPORTED_DTYPE: "dtype not carried",
    Reason.SYMBOLIC: "symbolic",
    Reason.MUTATION: "in-place op",
    Reason.SMALL_REGION: "region too small",
    Reason.AUTOTUNE: "autotune",
}

MAX_TRIES = 8  # samples tried (eager raising ones are passed over) to find the ones to run


def op_key(op: Any) -> str:
    """``name`` or ``name/variant`` of an OpInfo (the table's first column)."""
    return f"{op.name}/{op.variant_test_name}" if op.variant_test_name else op.name


_OPINFOS: dict[str, Any] | None = None


def opinfos() -> dict[str, Any]:
    """Every OpInfo of ``op_db`` by :func:`op_key` (loaded once per process)."""
    global _OPINFOS
    if _OPINFOS is None:
        from torch.testing._internal.common_methods_invocations import op_db

        _OPINFOS = {op_key(op): op for op in op_db}
    return _OPINFOS


@dataclass(frozen=True)
class Case:
    """One (op, dtype, direction) of the suite."""

    op: str
    dtype: str
    direction: str

    @property
    def id(self) -> str:
        """The pytest id, ``op[/variant]-dtype-direction``."""
        return f"{self.op}-{self.dtype}-{self.direction}"

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        """The inverse of :attr:`id` (the op name may itself hold ``-``)."""
        op, dtype, direction = case_id.rsplit("-", 2)
        return cls(op, dtype, direction)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.op, self.dtype, self.direction)


def _directions(op: Any, dtype: str) -> list[str]:
    """The directions that apply to ``op`` in ``dtype`` (see the module docstring)."""
    if dtype not in FLOAT_DTYPES or not op.supports_autograd:
        return ["forward"]
    if TORCH_DTYPES[dtype] not in op.supported_backward_dtypes("cpu"):
        return ["forward"]
    return list(DIRECTIONS)


def all_cases(mode: str = "full", flavour: str = "standard") -> list[Case]:
    """The cases of ``mode`` (``full``, or ``fast``: :func:`~.selection.fast_cases` of
    ``flavour``) in a deterministic order."""
    cases = []
    for key, op in opinfos().items():
        if key in RANDOM_OPS:
            continue
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if TORCH_DTYPES[dtype] not in supported:
                continue
            for direction in _directions(op, dtype):
                cases.append(Case(key, dtype, direction))
    if mode == "fast":
        fast = fast_cases((c.key for c in cases), flavour)
        cases = [c for c in cases if c.key in fast]
    return cases


def run_flavour() -> str:
    """The flavour (``table.FLAVOURS``) this process's compiled runs are in: ``openvino`` when
    OpenVINO's provider is among the providers the options give (``ORT_LAZY_PROVIDERS``),
    ``training`` on onnxruntime-training, else ``standard``."""
    from ort_lazy.options import Options
    from ort_lazy.runtime.flavour import flavour

    providers = Options.from_env(**ON_ORT).resolve_providers(None)
    if "OpenVINOExecutionProvider" in providers:
        return "openvino"
    if flavour() == "onnxruntime-training":
        return "training"
    return "standard"


# --------------------------------------------------------------------------------- results


@dataclass
class SampleResult:
    """What one sample did."""

    index: int
    status: str
    detail: str = ""
    ort_runs: int = 0
    ops: int = 0  # compute ops in the compiled graphs
    ops_on_ort: int = 0
    max_error: float = 0.0  # largest |actual - expected| / (atol + rtol*|expected|) seen (<= 1: within)
    culprit: str = ""  # for a defect: which stage deviates (see _diagnose)
    reasons: dict[str, set[str]] = field(default_factory=dict)  # for a fallback: why


@dataclass
class CaseResult:
    """The status of a case over its samples."""

    status: str
    first: str
    samples: list[SampleResult] = field(default_factory=list)
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        """A JSON-able summary (for ``--opinfo-results`` and the terminal summary)."""
        return {
            "status": self.status,
            "first": self.first,
            "samples": len([s for s in self.samples if not s.status.startswith("skip")]),
            "seconds": round(self.seconds, 3),
            "ops": sum(s.ops for s in self.samples),
            "ops_on_ort": sum(s.ops_on_ort for s in self.samples),
            "max_error": max((s.max_error for s in self.samples), default=0.0),
            "details": [f"{s.index}: {s.status}" + (f" | {s.detail}" if s.detail else "") for s in self.samples],
        }


class CaseTimeout(BaseException):
    """A case ran past its time limit (a BaseException: nothing on the way may swallow it)."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the body after ``seconds`` (main thread only; else no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"case ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------ execution


@dataclass
class _Run:
    """Flattened results of one call: outputs, inputs after the call, gradients."""

    outputs: list[Any]
    inputs: list[Any]
    grads: list[torch.Tensor | None] | None
    phases: dict[str, Any] = field(default_factory=dict)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def _cotangent(t: torch.Tensor, i: int, like: torch.dtype | None = None) -> torch.Tensor:
    """The seeded cotangent of output ``i``; with ``like``, the values drawn for that dtype."""
    g = torch.Generator().manual_seed(1000 + i)
    drawn = like or t.dtype
    base = torch.float64 if drawn == torch.float64 else torch.float32
    return torch.randn(t.shape, generator=g, dtype=base).to(drawn).to(t.dtype)


@dataclass
class _Phase:
    """Metrics of one phase (forward or backward) of a compiled call."""

    counters: dict[str, int]
    fallbacks: dict[str, dict[str, int]]
    records: list[GraphRecord]
    breaks: list[str]  # dynamo's graph-break reasons (first lines)


def _graph_breaks() -> list[str]:
    from torch._dynamo.utils import counters

    reasons = {msg.strip().splitlines()[0] for group in ("graph_break", "unimplemented") for msg in counters[group]}
    return sorted(r for r in reasons if r)


@contextlib.contextmanager
def _phase(out: dict[str, _Phase], name: str) -> Iterator[None]:
    metrics.reset()
    with recording() as records:
        try:
            yield
        finally:
            out[name] = _Phase(metrics.counters(), metrics.fallbacks(), list(records), _graph_breaks())


def _execute(
    fn: Callable[..., Any],
    sample: Any,
    direction: str,
    seed: int,
    phases: dict[str, _Phase] | None = None,
    cotangents_like: torch.dtype | None = None,
) -> _Run:
    """Call ``fn`` on a copy of ``sample``; for ``backward`` also take the gradients (with the
    cotangents drawn for ``cotangents_like`` when given: a widened run gets the same ones)."""
    inp, args, kwargs = pytree.tree_map(_clone, (sample.input, sample.args, sample.kwargs))
    record = phases if phases is not None else {}
    track = _phase if phases is not None else (lambda out, name: contextlib.nullcontext())
    torch.manual_seed(seed)
    grad_mode = torch.no_grad() if direction == "no_grad" else contextlib.nullcontext()
    with track(record, "forward"), grad_mode:
        out = fn(inp, *args, **kwargs)
    grads = None
    if direction == "backward":
        processed = sample.output_process_fn_grad(out)
        outs = [t for t in pytree.tree_leaves(processed) if isinstance(t, torch.Tensor) and t.requires_grad]
        leaves = [t for t in pytree.tree_leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs and leaves:
            cotangents = [_cotangent(t, i, cotangents_like) for i, t in enumerate(outs)]
            with track(record, "backward"):
                grads = list(torch.autograd.grad(outs, leaves, cotangents, allow_unused=True))
            grads = [g.detach() if g is not None else None for g in grads]

    def plain(v: Any) -> Any:
        return v.detach() if isinstance(v, torch.Tensor) else v

    return _Run(
        outputs=[plain(v) for v in pytree.tree_leaves(out)],
        inputs=[plain(v) for v in pytree.tree_leaves((inp, args, kwargs))],
        grads=grads,
    )


#: the compiled run's options: ops PyTorch runs faster by default (``torch_preferred_ops``: the
#: convolution and batch-norm gradients) go to ORT too, so their lowering is verified as well
ON_ORT: dict[str, Any] = {"torch_preferred_ops": ()}


def _compiled(op: Any, backend: str = "ort", options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A fresh ``torch.compile`` of the op (static shapes: one compile per sample, no guards
    to widen; dynamo's caches are reset so no earlier case's graph can be reused)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    target = op.op

    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    if options:
        compiled = torch.compile(call, backend=backend, dynamic=False, options=options)
    else:
        compiled = torch.compile(call, backend=backend, dynamic=False)
    return _without_seed_wrapper(compiled, target)


def _without_seed_wrapper(fn: Callable[..., Any], target: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a call of the OpInfo's ``target``) with the OpInfo's ``wrapper_set_seed`` (seed 42
    under ``freeze_rng_state``) lifted: dynamo does not trace that wrapper (the whole call ran in
    PyTorch, the op never compiled), and its fixed seed hid random samples (dropout in training)
    from the determinism check. Eager and compiled calls both get the op itself, seeded by
    :func:`_execute`."""
    namespace = getattr(target, "__globals__", {})
    if "wrapper_set_seed" not in getattr(getattr(target, "__code__", None), "co_names", ()):
        return fn

    def unseeded(*args: Any, **kwargs: Any) -> Any:
        saved = namespace["wrapper_set_seed"]
        namespace["wrapper_set_seed"] = _call_op
        try:
            return fn(*args, **kwargs)
        finally:
            namespace["wrapper_set_seed"] = saved

    return unseeded


def _eager(op: Any) -> Callable[..., Any]:
    """The OpInfo's op as eager runs it for comparison (see :func:`_without_seed_wrapper`)."""
    return _without_seed_wrapper(op.op, op.op)


def _call_op(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


# ----------------------------------------------------------------------------- comparison


@dataclass
class _Mismatch:
    where: str
    detail: str
    error: float = math.inf


def _has_repeats(sample: Any) -> bool:
    t = sample.input
    if not isinstance(t, torch.Tensor) or t.numel() < 2:
        return False
    return torch.unique(t.detach()).numel() < t.numel()


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor that ``torch.equal`` and arithmetic accept (complex32 has few kernels)."""
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg()
    return t.to(torch.complex64) if t.dtype == torch.complex32 else t


def _compare_tensor(actual: torch.Tensor, expected: torch.Tensor, where: str, exact_index: bool) -> tuple[_Mismatch | None, float]:
    """None when ``actual`` matches ``expected``; the ratio error/tolerance (<= 1 passes)."""
    if actual.dtype != expected.dtype:
        return _Mismatch(where, f"dtype {actual.dtype} != {expected.dtype}"), math.inf
    if actual.shape != expected.shape:
        return _Mismatch(where, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"), math.inf
    tolerance_dtype = torch.float16 if expected.dtype == torch.complex32 else expected.dtype
    actual, expected = _comparable(actual), _comparable(expected)
    if not exact_index and not expected.is_floating_point():
        return None, 0.0  # an index output of a tie-sensitive op on repeated values
    if expected.is_complex():
        tolerance_dtype = tolerance_dtype if tolerance_dtype == torch.float16 else expected.real.dtype
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    if not expected.is_floating_point():
        if torch.equal(actual, expected):
            return None, 0.0
        bad = int((actual != expected).sum())
        return _Mismatch(where, f"{bad}/{expected.numel()} elements differ (exact {expected.dtype})"), math.inf
    rtol, atol = TOLERANCES.get(tolerance_dtype, (1e-5, 1e-5))
    a, e = actual.double(), expected.double()
    finite = e[torch.isfinite(e)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    atol *= scale
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        return _Mismatch(where, f"NaN at {int((nan_a != nan_e).sum())} positions where the other has none"), math.inf
    inf_e = torch.isinf(e)
    if not torch.equal(torch.isinf(a) & (a == e), inf_e):
        return _Mismatch(where, f"infinities differ at {int((torch.isinf(a) != inf_e).sum())} positions"), math.inf
    both = ~(nan_e | inf_e)
    if not both.any():
        return None, 0.0
    diff = (a - e).abs()[both]
    ratio = float((diff / (atol + rtol * e.abs()[both])).max())
    if ratio <= 1.0:
        return None, ratio
    worst = int((diff / (atol + rtol * e.abs()[both])).argmax())
    return (
        _Mismatch(
            where,
            f"max abs err {float(diff.max()):.3g} (at expected {float(e[both][worst]):.4g}, got {float(a[both][worst]):.4g}; "
            f"rtol {rtol:g}, atol {atol:.3g})",
            ratio,
        ),
        ratio,
    )


def _compare_values(actual: list[Any], expected: list[Any], what: str, exact_index: bool) -> tuple[_Mismatch | None, float]:
    if len(actual) != len(expected):
        return _Mismatch(what, f"{len(actual)} values != {len(expected)}"), math.inf
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected)):
        where = f"{what} {i}"
        if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
                return _Mismatch(where, f"{type(a).__name__} != {type(e).__name__}"), math.inf
            mismatch, ratio = _compare_tensor(a, e, where, exact_index)
            if mismatch is not None:
                return mismatch, ratio
            worst = max(worst, ratio)
        elif isinstance(e, float) and isinstance(a, float):
            if not (math.isclose(a, e, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(a) and math.isnan(e))):
                return _Mismatch(where, f"{a!r} != {e!r}"), math.inf
        elif a != e:
            return _Mismatch(where, f"{a!r} != {e!r}"), math.inf
    return None, worst


def _compare_grads(actual: list[Any] | None, expected: list[Any] | None, ties: bool) -> tuple[_Mismatch | None, float]:
    if actual is None or expected is None:
        if (actual is None) != (expected is None):
            return _Mismatch("grad", "gradients taken on one side only"), math.inf
        return None, 0.0
    if len(actual) != len(expected):
        return _Mismatch("grad", f"{len(actual)} gradients != {len(expected)}"), math.inf
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a is None or e is None:
            # an unused input: None on one side, zeros on the other are the same gradient
            other = a if e is None else e
            if other is not None and bool(other.count_nonzero()):
                return _Mismatch(f"grad {i}", "gradient missing on one side"), math.inf
            continue
        if ties:
            # which of equal elements receives the gradient is not defined: compare the totals
            a, e = a.sum().reshape(1), e.sum().reshape(1)
        mismatch, ratio = _compare_tensor(a, e, f"grad {i}", True)
        if mismatch is not None:
            return mismatch, ratio
        worst = max(worst, ratio)
    return None, worst


def _compare(actual: _Run, expected: _Run, op: Any, sample: Any) -> tuple[_Mismatch | None, float]:
    ties = op.name in TIE_OPS and _has_repeats(sample) and not sample.kwargs.get("stable", False)
    worst = 0.0
    for check in (
        lambda: _compare_values(actual.outputs, expected.outputs, "output", not ties),
        lambda: _compare_values(actual.inputs, expected.inputs, "input (after the call)", True),
        lambda: _compare_grads(actual.grads, expected.grads, ties),
    ):
        mismatch, ratio = check()
        if mismatch is not None:
            return mismatch, ratio
        worst = max(worst, ratio)
    return None, worst


#: how many times eager's own error against float64 a result may have (see the module docstring)
ILL_CONDITIONED_FACTOR = 2.0


def _widened_reference(op: Any, sample: Any, direction: str, dtype: torch.dtype) -> _Run | None:
    """Eager on the sample with every floating tensor in float64 (same cotangents), or None when
    eager cannot run it so."""

    def widen(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.detach().double().requires_grad_(v.requires_grad)
        return v

    inp, args, kwargs = pytree.tree_map(widen, (sample.input, sample.args, sample.kwargs))
    wide = SimpleNamespace(input=inp, args=args, kwargs=kwargs, output_process_fn_grad=sample.output_process_fn_grad)
    try:
        return _execute(_eager(op), wide, direction, seed=0, cotangents_like=dtype)
    except Exception:
        return None


def _within_eager_error(actual: _Run, expected: _Run, reference: _Run) -> bool:
    """Every float output and gradient of ``actual`` is at most :data:`ILL_CONDITIONED_FACTOR`
    times as far from ``reference`` (float64) as eager's, NaN and infinities where eager has them."""

    def tensors(run: _Run) -> list[Any]:
        return list(run.outputs) + list(run.grads or [])

    a_all, e_all, r_all = tensors(actual), tensors(expected), tensors(reference)
    if not len(a_all) == len(e_all) == len(r_all):
        return False
    for a, e, r in zip(a_all, e_all, r_all):
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and isinstance(r, torch.Tensor)):
            if a is None and e is None:
                continue
            if not isinstance(e, torch.Tensor) and a == e:
                continue
            return False
        if not e.is_floating_point() or e.dtype == torch.float64:
            if not torch.equal(a, e):
                return False
            continue
        a, e, r = a.double(), e.double(), r.double()
        if a.shape != r.shape or not torch.equal(torch.isnan(a), torch.isnan(e)):
            return False
        if not torch.equal(torch.isinf(a) & (a == e), torch.isinf(e)):
            return False
        finite = torch.isfinite(e) & torch.isfinite(r)
        ours, eager = (a - r).abs()[finite], (e - r).abs()[finite]
        if ours.numel() and float(ours.max()) > ILL_CONDITIONED_FACTOR * float(eager.max()):
            return False
    return True


def _identical(a: _Run, b: _Run) -> bool:
    """Bit-identical results (NaN equal to NaN): the determinism check of eager."""

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            x, y = _comparable(x), _comparable(y)
            return bool(torch.equal(x, y) or (x.is_floating_point() and torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)))
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return type(x) is type(y) and x == y

    def all_same(xs: Sequence[Any] | None, ys: Sequence[Any] | None) -> bool:
        if xs is None or ys is None:
            return xs is ys
        return len(xs) == len(ys) and all(same(x, y) for x, y in zip(xs, ys))

    return all_same(a.outputs, b.outputs) and all_same(a.inputs, b.inputs) and all_same(a.grads, b.grads)


# --------------------------------------------------------------------------------- status


def _short_op(name: str) -> str:
    name = name.removeprefix("aten.")
    return name.removesuffix(".default")


def _error_text(e: BaseException) -> str:
    """``Type: first line`` of the innermost meaningful error (dynamo wraps backend errors)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None) or e.__cause__
        wrapper = type(e).__module__.startswith("torch._dynamo") and inner is not None
        if not wrapper:
            break
        e = inner
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    first = re.sub(r"0x[0-9a-fA-F]+", "0x…", first)
    first = re.sub(r"tensor\(.*", "tensor(…)", first)  # values printed in the message
    first = re.sub(r"/\S*/", "", first)  # paths differ between machines
    if len(first) > 160:
        first = first[:157] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _short_reason(reason: str) -> str:
    """A short, stable form of an ort-lazy fallback reason (``support.Reason`` plus details)."""
    if reason in SHORT_REASONS:
        return SHORT_REASONS[reason]
    if reason.startswith(Reason.NO_KERNEL):
        detail = reason[len(Reason.NO_KERNEL) :].lstrip(": ")
        if detail.startswith("ONNX type inference rejects"):
            nodes = sorted(set(re.findall(r"op_type:(\w+)", detail)))
            return "ONNX type inference rejects " + (", ".join(nodes) if nodes else "the translation")
        # ORT's own refusal names the op and its opset, and a node name that changes from run to run
        refused = sorted(set(re.findall(r"Could not find an implementation for (\w+)\(\d+\)", detail)))
        if refused:
            return "no ORT kernel: " + ", ".join(refused)
        return "no ORT kernel: " + re.sub(r"tensor\((\w+)\)", r"\1", detail)
    return reason


def _graph_ops(records: list[GraphRecord]) -> tuple[int, int]:
    ops = [r for record in records for r in record.ops]
    return len(ops), sum(1 for _, reason in ops if reason is None)


#: why nothing ran on ORT: short reason -> the ops it concerns (empty for graph-level reasons)
Reasons = dict[str, set[str]]


def _fallback_reasons(phases: dict[str, _Phase]) -> Reasons:
    """Why nothing (or, for ``backward``, not the backward) ran on ORT, from the metrics."""
    by_reason: Reasons = {}
    for phase in phases.values():
        for op, reasons in phase.fallbacks.items():
            for reason in reasons:
                by_reason.setdefault(_short_reason(reason), set()).add(_short_op(op))
    if by_reason:
        return by_reason
    counters = [p.counters for p in phases.values()]
    if any(c["ort_failures"] for c in counters):
        return {"ORT run failed": set()}
    if any(c["export_failures"] for c in counters):
        return {"graph compile failed": set()}
    if not any(p.records for p in phases.values()):
        breaks = sorted({b for p in phases.values() for b in p.breaks})
        return {"no graph (dynamo ran it in PyTorch" + (f": {', '.join(breaks)})" if breaks else ")"): set()}
    if not any(_graph_ops(p.records)[0] for p in phases.values()):
        return {"no compute op in the graph": set()}
    return {"ORT did not run": set()}


def render_reasons(reasons: Reasons) -> str:
    """``fallback: reason (op, op); reason ...``: sorted, at most four ops named per reason."""
    parts = []
    for reason in sorted(reasons):
        ops = sorted(reasons[reason])
        shown = ", ".join(ops[:4]) + (f" +{len(ops) - 4} more" if len(ops) > 4 else "")
        parts.append(f"{reason} ({shown})" if ops else reason)
    return "fallback: " + "; ".join(parts)


def _placement(phases: dict[str, _Phase], direction: str) -> Reasons | None:
    """None when ORT ran (for ``backward``: in the backward pass, unless that graph has no
    compute op), else why not."""
    fw = phases.get("forward")
    bw = phases.get("backward")
    if direction == "backward" and bw is not None:
        bw_compute = _graph_ops(bw.records)[0] > 0
        if bw.counters["ort_runs"] > 0 or (not bw_compute and fw is not None and fw.counters["ort_runs"] > 0):
            return None
        # the backward is what this direction is about: its reasons, the forward's if it has none
        return _fallback_reasons({"backward": bw} if bw_compute else phases)
    if any(p.counters["ort_runs"] for p in phases.values()):
        return None
    return _fallback_reasons(phases)


def _fold(results: list[SampleResult]) -> str:
    """One status for a case from its samples' (skipped samples aside when others ran):
    the first crash, else the first wrong, else ``ort`` if any sample ran on ORT, else the
    fallback reasons of all samples together."""
    ran = [r for r in results if not r.status.startswith("skip")]
    if not ran:
        return results[0].status if results else "skip: no sample inputs"
    for kind in ("crash", "wrong"):
        for r in ran:
            if r.status.startswith(kind):
                return r.status
    if any(r.status == "ort" for r in ran):
        return "ort"
    merged: Reasons = {}
    for r in ran:
        for reason, ops in r.reasons.items():
            merged.setdefault(reason, set()).update(ops)
    return render_reasons(merged)


# ------------------------------------------------------------------------------- diagnose


def _diagnose(op: Any, sample: Any, direction: str, expected: _Run) -> str:
    """Which stage a defect comes from: ``torch`` (PyTorch's own dynamo + AOTAutograd, backend
    ``aot_eager``, fails too), ``capture`` (ort-lazy's graph capture and rewrites fail with every
    region run in PyTorch, ``run_type=pytorch``) or ``ort`` (only when ORT runs the regions:
    the ONNX translation or ORT itself)."""
    for culprit, backend, options in (("torch", "aot_eager", None), ("capture", "ort", {"run_type": "pytorch"})):
        try:
            run = _execute(_compiled(op, backend, options), sample, direction, seed=0)
        except Exception:
            return culprit
        if _compare(run, expected, op, sample)[0] is not None:
            return culprit
    return "ort"


# ------------------------------------------------------------------------------- run_case


def _samples(op: Any, dtype: torch.dtype, direction: str) -> Iterator[Any]:
    """The OpInfo's samples, seeded (the same samples on every run and machine)."""
    torch.manual_seed(0)
    yield from op.sample_inputs("cpu", dtype, requires_grad=direction == "backward")


def _run_sample(op: Any, sample: Any, index: int, direction: str, diagnose: bool) -> SampleResult:
    try:
        expected = _execute(_eager(op), sample, direction, seed=0)
    except Exception as e:
        return SampleResult(index, "skip: eager raises", _error_text(e))
    try:
        again = _execute(_eager(op), sample, direction, seed=1)
    except Exception as e:
        return SampleResult(index, "skip: eager raises", _error_text(e))
    if not _identical(expected, again):
        return SampleResult(index, "skip: nondeterministic in eager")
    if direction == "backward" and expected.grads is None:
        return SampleResult(index, "skip: no differentiable output")
    phases: dict[str, _Phase] = {}
    try:
        actual = _execute(_compiled(op, options=ON_ORT), sample, direction, seed=0, phases=phases)
    except CaseTimeout:
        raise
    except Exception as e:
        text = _error_text(e)
        culprit = _diagnose(op, sample, direction, expected) if diagnose else ""
        return SampleResult(index, f"crash ({text})" + (f" [{culprit}]" if culprit else ""), text, culprit=culprit)
    ops, on_ort = (sum(x) for x in zip(*(_graph_ops(p.records) for p in phases.values()))) if phases else (0, 0)
    ort_runs = sum(p.counters["ort_runs"] for p in phases.values())
    mismatch, ratio = _compare(actual, expected, op, sample)
    dtype = sample.input.dtype if isinstance(sample.input, torch.Tensor) else None
    if (
        mismatch is not None
        and math.isfinite(mismatch.error)
        and dtype in (torch.float32, torch.float16, torch.bfloat16)
        and not mismatch.where.startswith("input")
    ):
        reference = _widened_reference(op, sample, direction, dtype)
        if reference is not None and _within_eager_error(actual, expected, reference):
            mismatch, ratio = None, 1.0
    if mismatch is not None:
        culprit = _diagnose(op, sample, direction, expected) if diagnose else ""
        where = re.sub(r" \d+$", "", mismatch.where) if mismatch.where.startswith("input") else mismatch.where
        status = f"wrong ({where})" + (f" [{culprit}]" if culprit else "")
        return SampleResult(index, status, f"{mismatch.where}: {mismatch.detail}", ort_runs, ops, on_ort, ratio, culprit)
    reasons = _placement(phases, direction)
    status = "ort" if reasons is None else render_reasons(reasons)
    return SampleResult(index, status, "", ort_runs, ops, on_ort, ratio, reasons=reasons or {})


def run_case(case: Case, samples: int = 2, timeout: float = 300.0, diagnose: bool = True) -> CaseResult:
    """Run ``case`` on its first ``samples`` samples that eager can run; see the module docstring."""
    op = opinfos()[case.op]
    dtype = TORCH_DTYPES[case.dtype]
    start = time.perf_counter()
    results: list[SampleResult] = []
    with warnings.catch_warnings(), _time_limit(timeout):
        warnings.simplefilter("ignore")
        try:
            ran = 0
            samples_iter = _samples(op, dtype, case.direction)
            for index in range(MAX_TRIES):
                try:
                    sample = next(samples_iter)
                except StopIteration:
                    break
                except Exception as e:  # the OpInfo's own sample generator fails: nothing to compare
                    results.append(SampleResult(index, "skip: sample inputs raise", _error_text(e)))
                    break
                result = _run_sample(op, sample, index, case.direction, diagnose)
                results.append(result)
                if not result.status.startswith("skip"):
                    ran += 1
                    if ran >= samples:
                        break
        except CaseTimeout as e:
            results.append(SampleResult(len(results), f"crash (CaseTimeout: {e})"))
        finally:
            torch._dynamo.reset()
            session_cache().clear()
    ran = [r for r in results if not r.status.startswith("skip")]
    return CaseResult(
        status=_fold(results),
        first=ran[0].status if ran else _fold(results),
        samples=results,
        seconds=time.perf_counter() - start,
    )

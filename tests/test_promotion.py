"""Binary ops over every pair of operand dtypes, as eager computes them.

Type promotion between mixed operands (a float16 tensor and a float64 0-d tensor, an int8
tensor and a Python float, bool and uint8) is where the exporter's typing, ORT's kernels and
ort-lazy's rewrites meet; PyTorch's op database samples each op in one dtype at a time. Each
case compiles one graph holding every op eager accepts for the pair, and compares each result's
dtype, shape and values with eager's (integers and bools exactly), with ORT shown to run.

The default run takes a float tensor and an integer 0-d tensor as first operands of every pair
(against every second dtype, bool and the half types included), and a float, an integer and
bool first for the rest; the other first dtypes are in the full tier (``--full-tier``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import compile_ort, tiered
from ort_lazy import metrics

DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
]

OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "floor_divide": torch.floor_divide,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": lambda a, b: a == b,
    "lt": lambda a, b: a < b,
    "ge": lambda a, b: a >= b,
    "atan2": torch.atan2,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "logical_and": torch.logical_and,
    "where": lambda a, b: torch.where(a > 0 if a.dtype != torch.bool else a, a, b),
    "copysign": torch.copysign,
    "hypot": torch.hypot,
    "lshift": lambda a, b: a << b,
    "rshift": lambda a, b: a >> b,
    "clamp_min": lambda a, b: torch.clamp(a, min=b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "xlogy": torch.xlogy,
    "addcmul": lambda a, b: torch.addcmul(a, b, b, value=2),
}
# dynamo's fake kernels refuse shifts of or by bool tensors that eager computes (every backend)
_DYNAMO_REFUSES = {("lshift", torch.bool), ("rshift", torch.bool)}


def _make(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(1, 9, shape, generator=g).to(dtype)
    values = torch.randint(1, 9, shape, generator=g) * (torch.randint(0, 2, shape, generator=g) * 2 - 1)
    return values.to(dtype)  # no zeros: integer division by zero raises in eager


def _same(got: Any, expected: Any) -> str | None:
    if not isinstance(expected, torch.Tensor):
        return None if got == expected else f"{got} != {expected}"
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return f"{got.dtype}{tuple(got.shape)} != {expected.dtype}{tuple(expected.shape)}"
    if expected.dtype.is_floating_point:
        tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(expected.dtype, 1e-6)
        bad = ~torch.isclose(got.double(), expected.double(), rtol=tol, atol=tol, equal_nan=True)
    else:
        bad = got != expected
    return f"values differ: {got[bad][:6].tolist()} vs {expected[bad][:6].tolist()}" if bad.any() else None


def _accepted(a: Any, b: Any, dtypes: tuple[torch.dtype, ...]) -> dict[str, Any]:
    """The ops eager computes for these operands, with eager's results."""
    out = {}
    for name, op in OPS.items():
        if any((name, d) in _DYNAMO_REFUSES for d in dtypes):
            continue
        try:
            out[name] = op(a, b)
        except (RuntimeError, TypeError, NotImplementedError):
            continue
    return out


SCALARS = {"int": 3, "float": 2.5, "bool": True, "huge float": 1e300, "small float": math.pi / 1e6}


#: the (first dtype, second operand's form) pairs of the default run
_FAST_PAIRS = [(torch.float32, "tensor"), (torch.int32, "0-d")]
_PAIRS = [(first, form) for form in ("tensor", "0-d") for first in DTYPES]


@pytest.mark.parametrize("first,form", tiered(_PAIRS, _FAST_PAIRS, unpack=True), ids=[f"{d}-{f}" for d, f in _PAIRS])
def test_binary_ops_over_dtype_pairs(first: torch.dtype, form: str) -> None:
    failures = []
    for second in DTYPES:
        a = _make(first, (4, 5), 0)
        b = _make(second, (5,) if form == "tensor" else (), 1)
        expected = _accepted(a, b, (first, second))
        names = list(expected)

        def fn(a: torch.Tensor, b: torch.Tensor, names: list[str] = names) -> list[Any]:
            return [OPS[n](a, b) for n in names]

        torch._dynamo.reset()
        metrics.reset()
        got = compile_ort(fn)(a, b)
        assert metrics.counters()["ort_runs"] >= 1, (first, second, metrics.fallbacks())
        for name, g in zip(names, got):
            problem = _same(g, expected[name])
            if problem:
                failures.append(f"{name}({first}, {second} {form}): {problem}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("first", tiered(DTYPES, [torch.float32, torch.int64, torch.bool]), ids=str)
def test_binary_ops_with_python_numbers(first: torch.dtype) -> None:
    failures = []
    a = _make(first, (4, 5), 0)
    cases = [(kind, value, name) for kind, value in SCALARS.items()
             for name in _accepted(a, value, (first,))]

    def fn(a: torch.Tensor) -> list[Any]:
        return [OPS[name](a, value) for _, value, name in cases]

    expected = fn(a)
    torch._dynamo.reset()
    got = compile_ort(fn)(a)
    assert metrics.counters()["ort_runs"] >= 1, metrics.fallbacks()
    for (kind, _, name), g, e in zip(cases, got, expected):
        problem = _same(g, e)
        if problem:
            failures.append(f"{name}({first}, {kind}): {problem}")
    assert not failures, "\n".join(failures)



#: Python's reflected operators: the number is the left operand (``1.0 - mask``, ``2 ** x``)
REFLECTED: dict[str, Callable[[Any, Any], Any]] = {
    "radd": lambda n, t: n + t,
    "rsub": lambda n, t: n - t,
    "rmul": lambda n, t: n * t,
    "rtruediv": lambda n, t: n / t,
    "rfloordiv": lambda n, t: n // t,
    "rmod": lambda n, t: n % t,
    "rpow": lambda n, t: n ** t,
    "rand": lambda n, t: n & t,
    "ror": lambda n, t: n | t,
    "rxor": lambda n, t: n ^ t,
    "rlshift": lambda n, t: n << t,
    "rrshift": lambda n, t: n >> t,
}
#: left to PyTorch on purpose, with the reasons ort-lazy gives: integer powers (ORT computes them
#: in floating point), ORT's missing kernels (``Where`` of int16 in a right shift, ``Add`` of
#: bools), and uint8 shifts, whose translation is ill-typed (as with two tensors)
_SHIFTS = ("no ORT kernel for these dtypes on this provider: Where(tensor(int16))", "the ONNX translation is ill-typed")
_REFLECTED_IN_PYTORCH = {
    "aten.pow.Scalar": ("integer powers are computed in floating point",),
    "aten.bitwise_right_shift.Tensor": _SHIFTS,
    "aten.bitwise_left_shift.Tensor": _SHIFTS,
    "aten.add.Tensor": ("no ORT kernel for these dtypes on this provider: Add(tensor(bool))",),
}


@pytest.mark.parametrize("first", tiered(DTYPES, [torch.float32, torch.float16, torch.int64, torch.bool]), ids=str)
def test_python_numbers_on_the_left(first: torch.dtype) -> None:
    """``number <op> tensor`` as eager computes it, every op on ORT (``1.0 - attention_mask`` on
    an integer mask, XLNet's, and ``3 // x`` were left to PyTorch: their decompositions put the
    number where the exporter wants a tensor)."""
    t = _make(first, (4, 5), 0)
    if first.is_floating_point:
        t = torch.where(t.abs() < 0.5, torch.ones_like(t), t)  # far from zero for // and %
    cases = []
    for kind, value in SCALARS.items():
        for name, op in REFLECTED.items():
            if ("shift" in name and first == torch.bool) or (first == torch.bool and name in ("rsub", "rpow")):
                continue  # dynamo refuses these for bool tensors (every backend)
            try:
                op(value, t)
            except (RuntimeError, TypeError, NotImplementedError, OverflowError):
                continue
            cases.append((kind, value, name))

    def fn(t: torch.Tensor) -> list[Any]:
        return [REFLECTED[name](value, t) for _, value, name in cases]

    expected = fn(t)
    torch._dynamo.reset()
    metrics.reset()
    got = compile_ort(fn)(t)
    assert metrics.counters()["ort_runs"] >= 1, metrics.fallbacks()
    failures = [f"{name}({kind}, {first}): {problem}" for (kind, _, name), g, e in zip(cases, got, expected)
                if (problem := _same(g, e))]
    unexplained = {op: reasons for op, reasons in metrics.fallbacks().items()
                   if any(not any(known in r for known in _REFLECTED_IN_PYTORCH.get(op, ())) for r in reasons)}
    assert not failures and not unexplained, "\n".join(failures) + f"\nleft to PyTorch: {unexplained}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_arithmetic_on_python_floats_is_eager_exact_on_cpu(dtype: torch.dtype) -> None:
    """Eager's CPU kernels multiply and divide a float16/bfloat16 tensor by a Python float in
    float32 with the number in float32, and add or subtract it rounded to the tensor's type:
    the same bits on ORT's CPU provider. Before, products and quotients rounded the number
    first: one step off inside float16's range, and ``x / 1e5`` was 0 (1e5 is infinity in
    float16)."""
    numbers = [0.1, 3.7, 1 / 3, 1e-6, 1e5, 7e4, math.pi / 1e6, 1e-30]
    x = _make(dtype, (64,), 0)

    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for s in numbers:
            out += [x * s, x / s, x + s, x - s, s - x, torch.div(x, s, rounding_mode="floor")]
        return out

    got, expected = compile_ort(fn)(x), fn(x)
    failures = [f"{numbers[i // 6]} op {i % 6}" for i, (g, e) in enumerate(zip(got, expected)) if not torch.equal(g, e)]
    assert not failures, failures
    assert metrics.counters()["ort_runs"] == 1 and metrics.counters()["fallback_ops"] == 0, metrics.fallbacks()


REDUCTIONS: dict[str, Callable[[torch.Tensor, torch.dtype], Any]] = {
    "sum": lambda x, d: x.sum(1, dtype=d),
    "sum_all": lambda x, d: x.sum(dtype=d),
    "mean": lambda x, d: x.mean(1, dtype=d),
    "mean_all": lambda x, d: x.mean(dtype=d),
    "prod": lambda x, d: x.prod(1, dtype=d),
    "cumsum": lambda x, d: x.cumsum(1, dtype=d),
    "cumprod": lambda x, d: x.cumprod(1, dtype=d),
    "softmax": lambda x, d: x.softmax(1, dtype=d),
    "log_softmax": lambda x, d: x.log_softmax(1, dtype=d),
    "nansum": lambda x, d: x.nansum(1, dtype=d),
}


@pytest.mark.parametrize("first", tiered(DTYPES, [torch.float32, torch.int64]), ids=str)
def test_reductions_with_a_dtype_argument(first: torch.dtype) -> None:
    """``dtype=`` casts the input before reducing: an integer tensor's ``mean(dtype=float32)``
    was averaged as integers and truncated (0.8 came out 0.0) before."""
    x = _make(first, (4, 5), 0)
    cases = []
    for name, op in REDUCTIONS.items():
        for d in DTYPES:
            try:
                cases.append((name, d, op(x, d)))
            except (RuntimeError, TypeError):
                continue

    def fn(x: torch.Tensor) -> list[Any]:
        return [REDUCTIONS[name](x, d) for name, d, _ in cases]

    torch._dynamo.reset()
    got = compile_ort(fn)(x)
    assert metrics.counters()["ort_runs"] >= 1, metrics.fallbacks()
    failures = [f"{name}({first}, dtype={d}): {p}" for (name, d, e), g in zip(cases, got) if (p := _same(g, e))]
    assert not failures, "\n".join(failures)

"""ONNX translations of PyTorch's orthogonal polynomials (``torch.special.*_polynomial_*``).

Each op takes ``x`` and a degree ``n`` per element (both broadcast; ``n`` may hold floats, which
are truncated to integers, and a negative ``n`` gives 0). PyTorch evaluates every element by the
polynomial family's three-term recurrence, run up to that element's degree, with shortcuts for
special arguments (``x = ±1``, a closed trigonometric form for large degrees of the Chebyshev
kinds inside ``(-1, 1)``, NaN beyond the degrees Hermite polynomials are computed for).

The degree is runtime data, so no graph of a fixed length computes the recurrence for every
``n``: the translation runs it in an ONNX ``Loop`` over all elements at once, each step updating
only the elements whose degree is not reached yet, until none is left (an element whose value
became NaN stays NaN, as in PyTorch, and no longer keeps the loop going). The result then takes,
element by element, the branch PyTorch's algorithm takes there.

The arithmetic is PyTorch's, in the same order and type, so the results are eager's up to
rounding of a few elementary functions:

* PyTorch's CPU kernels are compiled with fused multiply-add: a step ``c * q - d * p`` is one
  rounding of the exact ``c * q - d * p'`` (``p' = d * p`` rounded). In float32 that value is
  computed exactly in float64 and rounded once; in float64 with an exact two-product and
  two-sum, rounded once.
* float32 ``acos`` / ``cos`` / ``sin`` are computed in float64 and rounded, which is what the C
  library's float functions return; ORT has no float64 ``Acos``, so the float64 one is the
  float32 value refined by Newton steps on ``sin`` (of the half angle, well conditioned).

Results are float32 or float64 (integer and bool inputs give float32, like PyTorch); other
result types are not translated (PyTorch's CPU kernels have none).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .emitter import Emitter as _Emitter
from .emitter import translation_emitter

__all__ = ["POLYNOMIAL_OPS", "TRANSLATIONS"]

#: the polynomial ops, by the name of their ``torch.special`` function
_NAMES = (
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
)

#: the overloads translated: both operands tensors, or one of them a Python number
_OVERLOADS = ("default", "x_scalar", "n_scalar")

#: every aten overload :data:`TRANSLATIONS` translates
POLYNOMIAL_OPS: tuple[torch._ops.OpOverload, ...] = tuple(
    getattr(getattr(torch.ops.aten, f"special_{name}"), overload)
    for name in _NAMES
    for overload in _OVERLOADS
)

#: recurrence steps per loop iteration (fewer iterations of ORT's loop machinery)
_UNROLL = 4
#: the largest degree PyTorch computes Hermite polynomials for, by result type (NaN beyond)
_HERMITE_LIMIT = {"FLOAT": 128, "DOUBLE": 512}
#: pi - float(pi)
_PI_LOW = 1.2246467991473532e-16


class _Context:
    """The values one translation computes with, in the result type ``t``."""

    def __init__(self, e: _Emitter, x: Any, n: Any, t: Any) -> None:
        import onnx_ir as ir

        self.e = e
        self.t = t
        self.double = t == ir.DataType.DOUBLE
        xt, nt = e.cast(x, t), e.cast(n, t)
        # both to the broadcast shape (ONNX Expand broadcasts both ways)
        self.x = e.op("Expand", xt, e.op("Shape", nt))
        nf = e.op("Expand", nt, e.op("Shape", xt))
        # the integer degree: truncation toward zero; NaN, infinities and values outside int64
        # (which C++ converts to INT64_MIN on x86) count as negative
        in_range = e.op(
            "And", e.op("GreaterOrEqual", nf, self.c(-(2.0**63))), e.op("Less", nf, self.c(2.0**63))
        )
        self.n = e.op("Cast", e.op("Where", in_range, nf, self.c(-1.0)), to=ir.DataType.INT64)
        self.nt = e.op("Cast", self.n, to=t)

    def c(self, value: float) -> Any:
        """A constant of the result type."""
        return self.e.const(value, self.t)

    def i(self, value: int) -> Any:
        """An int64 constant."""
        import onnx_ir as ir

        return self.e.const(value, ir.DataType.INT64)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.e.op("Where", cond, a, b)

    def n_is(self, value: int) -> Any:
        return self.e.op("Equal", self.n, self.i(value))

    def n_above(self, value: int) -> Any:
        return self.e.op("Greater", self.n, self.i(value))

    def even(self) -> Any:
        return self.e.op("Equal", self.e.op("Mod", self.n, self.i(2)), self.i(0))

    def from_int(self, value: Any) -> Any:
        """An int64 value as the result type."""
        return self.e.op("Cast", value, to=self.t)

    def n_plus_1(self) -> Any:
        """``n + 1`` computed in int64, as the result type."""
        return self.from_int(self.e.op("Add", self.n, self.i(1)))

    def two_n_plus_1(self) -> Any:
        """``n + n + 1`` computed in int64, as the result type."""
        return self.from_int(self.e.op("Add", self.e.op("Add", self.n, self.n), self.i(1)))

    def signed(self, positive: Any, value: Any) -> Any:
        """``value`` where ``positive``, else ``-value``."""
        return self.where(positive, value, self.e.op("Neg", value))

    # elementary functions with the C library's rounding in float32

    def _libm(self, op_type: str, value: Any) -> Any:
        import onnx_ir as ir

        if self.double:
            return self.e.op(op_type, value)
        wide = self.e.op(op_type, self.e.cast(value, ir.DataType.DOUBLE))
        return self.e.cast(wide, self.t)

    def cos(self, value: Any) -> Any:
        return self._libm("Cos", value)

    def sin(self, value: Any) -> Any:
        return self._libm("Sin", value)

    def acos(self, value: Any) -> Any:
        """``acos(value)`` (NaN outside ``[-1, 1]``)."""
        import onnx_ir as ir

        e = self.e
        d = ir.DataType.DOUBLE
        u = e.cast(value, d)
        half = e.const(0.5, d)
        # |u| <= 1/2: pi/2 - asin(u)
        middle = e.op("Add", e.op("Sub", e.const(math.pi / 2, d), self._asin(u)), e.const(_PI_LOW / 2, d))
        # |u| > 1/2: acos(|u|) = 2 asin(s), s = sqrt((1 - |u|) / 2) in [0, 1/2), exact up to the sqrt
        s = e.op("Sqrt", e.op("Mul", e.op("Sub", e.const(1.0, d), e.op("Abs", u)), half))
        phi = self._asin(s)
        theta = e.op("Add", phi, phi)
        # and pi - acos(-u) for u < 0
        reflected = e.op("Add", e.op("Sub", e.const(math.pi, d), theta), e.const(_PI_LOW, d))
        outer = e.op("Where", e.op("Less", u, e.const(0.0, d)), reflected, theta)
        result = e.op("Where", e.op("LessOrEqual", e.op("Abs", u), half), middle, outer)
        return e.cast(result, self.t)

    def _asin(self, s: Any) -> Any:
        """``asin(s)`` in float64 for ``|s| <= 1/2``: Newton steps on ``sin(phi) = s`` from the
        float32 value."""
        import onnx_ir as ir

        e = self.e
        phi = e.cast(e.op("Asin", e.cast(s, ir.DataType.FLOAT)), ir.DataType.DOUBLE)
        for _ in range(2):
            phi = e.op("Sub", phi, e.op("Div", e.op("Sub", e.op("Sin", phi), s), e.op("Cos", phi)))
        return phi


@dataclass(frozen=True)
class _Recurrence:
    """``P(j+1) = (c(j) * P(j) - d(j) * P(j-1)) / e(j)``, from ``P(0) = 1`` and ``P(1)``.

    ``c``: the factor of ``P(j)``, a tensor fixed for all steps or built per step from the
    degree ``j`` (int64 scalar); ``d`` / ``e``: per-step factors (None: 1).
    """

    c_fixed: Any = None
    c_step: Callable[[_Context, _Emitter, Any], Any] | None = None
    d: Callable[[_Context, _Emitter, Any], Any] | None = None
    e: Callable[[_Context, _Emitter, Any], Any] | None = None


def _split(e: _Emitter, a: Any, t: Any) -> tuple[Any, Any]:
    """``a = hi + lo`` with 26-bit halves (Veltkamp), for exact float64 products."""
    big = e.op("Mul", a, e.const(134217729.0, t))
    hi = e.op("Sub", big, e.op("Sub", big, a))
    return hi, e.op("Sub", a, hi)


def _fused(ctx: _Context, e: _Emitter, c: Any, c_parts: tuple[Any, Any] | None, q: Any, dp: Any) -> Any:
    """``c * q - dp`` rounded once (a fused multiply-add)."""
    import onnx_ir as ir

    t = ctx.t
    if not ctx.double:
        d = ir.DataType.DOUBLE
        exact = e.op("Sub", e.op("Mul", e.cast(c, d), e.cast(q, d)), e.cast(dp, d))
        return e.cast(exact, t)
    c_hi, c_lo = c_parts if c_parts is not None else _split(e, c, t)
    q_hi, q_lo = _split(e, q, t)
    h = e.op("Mul", c, q)
    # c * q = h + low exactly (where nothing overflows or underflows)
    low = e.op("Sub", e.op("Mul", c_hi, q_hi), h)
    low = e.op("Add", low, e.op("Mul", c_hi, q_lo))
    low = e.op("Add", low, e.op("Mul", c_lo, q_hi))
    low = e.op("Add", low, e.op("Mul", c_lo, q_lo))
    # h - dp = s + err exactly
    s = e.op("Sub", h, dp)
    back = e.op("Sub", s, h)
    err = e.op("Sub", e.op("Sub", h, e.op("Sub", s, back)), e.op("Add", dp, back))
    correction = e.op("Add", err, low)
    # a correction that is not finite means h or s is not: their own value is the result
    finite = e.op("Equal", e.op("Sub", correction, correction), e.const(0.0, t))
    return e.op("Where", finite, e.op("Add", s, correction), s)


def _run_recurrence(ctx: _Context, rec: _Recurrence, first: Any, degree: Any) -> Any:
    """``P(degree)`` per element by the recurrence (elements with ``degree`` <= 1: ``first``)."""
    import onnx_ir as ir

    outer = ctx.e
    t = ctx.t
    i64 = ir.DataType.INT64
    c_parts = _split(outer, rec.c_fixed, t) if rec.c_fixed is not None and ctx.double else None
    one = outer.op("Expand", ctx.c(1.0), outer.op("Shape", first))

    def going(e: _Emitter, j: Any, q: Any) -> Any:
        """Whether some element still has steps to take (degree not reached, value not NaN)."""
        live = e.op("And", e.op("Less", j, degree), e.op("Not", e.op("IsNaN", q)))
        return e.op("Greater", e.op("ReduceSum", e.op("Cast", live, to=i64), keepdims=0), e.const(0, i64))

    j0 = ctx.i(1)
    start = going(outer, j0, first)

    body_nodes: list[Any] = []
    e = _Emitter(body_nodes, outer.name() + "_loop", None)
    iteration = ir.Value(name=e.name(), type=ir.TensorType(i64), shape=ir.Shape([]))
    cond_in = ir.Value(name=e.name(), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    j_in = ir.Value(name=e.name(), type=ir.TensorType(i64), shape=ir.Shape([]))
    p_in = ir.Value(name=e.name(), type=ir.TensorType(t), shape=first.shape)
    q_in = ir.Value(name=e.name(), type=ir.TensorType(t), shape=first.shape)
    j, p, q = j_in, p_in, q_in
    for _ in range(_UNROLL):
        c = rec.c_fixed if rec.c_fixed is not None else rec.c_step(ctx, e, j)
        dp = p if rec.d is None else e.op("Mul", rec.d(ctx, e, j), p)
        r = _fused(ctx, e, c, c_parts if rec.c_fixed is not None else None, q, dp)
        if rec.e is not None:
            r = e.op("Div", r, rec.e(ctx, e, j))
        active = e.op("Less", j, degree)
        p = e.op("Where", active, q, p)
        q = e.op("Where", active, r, q)
        j = e.op("Add", j, e.const(1, i64))
    cond_out = going(e, j, q)
    body = ir.Graph(
        [iteration, cond_in, j_in, p_in, q_in],
        [e.op("Identity", cond_out), e.op("Identity", j), e.op("Identity", p), e.op("Identity", q)],
        nodes=body_nodes,
        name=e.prefix,
    )
    _, _, q_out = outer.op("Loop", None, start, j0, one, first, num_outputs=3, body=body)
    return q_out


def _step_degree(ctx: _Context, e: _Emitter, j: Any) -> Any:
    return e.op("Cast", j, to=ctx.t)


def _step_two_j(ctx: _Context, e: _Emitter, j: Any) -> Any:
    return e.op("Cast", e.op("Add", j, j), to=ctx.t)


def _step_j_plus_1(ctx: _Context, e: _Emitter, j: Any) -> Any:
    import onnx_ir as ir

    return e.op("Cast", e.op("Add", j, e.const(1, ir.DataType.INT64)), to=ctx.t)


def _chebyshev(ctx: _Context, kind: str, shifted: bool) -> Any:
    """Chebyshev polynomials of the first to fourth kind (``t u v w``), or the shifted ones."""
    e = ctx.e
    x = ctx.x
    one, zero = ctx.c(1.0), ctx.c(0.0)
    z = e.op("Sub", e.op("Add", x, x), one) if shifted else x
    two_z = e.op("Add", z, z)
    first = {"t": z, "u": two_z, "v": e.op("Sub", two_z, one), "w": e.op("Add", two_z, one)}[kind]
    n_plus_1, two_n_plus_1 = ctx.n_plus_1(), ctx.two_n_plus_1()
    even = ctx.even()
    positive = e.op("Greater", x, zero)

    # special arguments: x = ±1 (shifted: x = 1 and x = 0)
    if shifted:
        at_top, at_bottom = e.op("Equal", x, one), e.op("Equal", x, zero)
        top = {"t": one, "u": n_plus_1, "v": one, "w": two_n_plus_1}[kind]
        bottom = {
            "t": ctx.signed(even, one),
            "u": ctx.signed(even, n_plus_1),
            "v": ctx.signed(even, two_n_plus_1),
            "w": ctx.signed(even, one),
        }[kind]
        special = e.op("Or", at_top, at_bottom)
        special_value = ctx.where(at_top, top, bottom)
    else:
        special = e.op("Equal", e.op("Abs", x), one)
        up_or_even = e.op("Or", positive, even)
        special_value = {
            "t": ctx.signed(up_or_even, one),
            "u": ctx.signed(up_or_even, n_plus_1),
            "v": ctx.where(positive, one, ctx.signed(even, two_n_plus_1)),
            "w": ctx.where(positive, two_n_plus_1, ctx.signed(even, one)),
        }[kind]

    # large degrees inside (-1, 1): the trigonometric form
    threshold = (6 if kind != "w" else 4) if shifted else (6 if kind == "t" else 8)
    trig = e.op("And", ctx.n_above(threshold), e.op("Less", e.op("Abs", z), one))
    theta = ctx.acos(z)
    half_theta = e.op("Div", theta, ctx.c(2.0))
    n_half = e.op("Add", ctx.nt, ctx.c(0.5))
    if kind == "t":
        trig_value = ctx.cos(e.op("Mul", ctx.nt, theta))
    elif kind == "u":
        sin_theta = ctx.sin(theta)
        angle = e.op("Mul", n_plus_1, theta)
        general = e.op("Div", ctx.sin(angle), sin_theta)
        degenerate = e.op("Div", e.op("Mul", n_plus_1, ctx.cos(angle)), z)
        trig_value = ctx.where(e.op("Equal", sin_theta, zero), degenerate, general)
    elif kind == "v":
        general = e.op("Div", ctx.cos(e.op("Mul", n_half, theta)), ctx.cos(half_theta))
        degenerate = ctx.signed(even, two_n_plus_1)
        trig_value = ctx.where(e.op("Equal", ctx.sin(half_theta), one), degenerate, general)
    else:
        general = e.op("Div", ctx.sin(e.op("Mul", n_half, theta)), ctx.sin(half_theta))
        degenerate = (
            ctx.signed(even, one) if shifted else ctx.where(positive, two_n_plus_1, ctx.signed(even, one))
        )
        trig_value = ctx.where(e.op("Equal", ctx.cos(half_theta), one), degenerate, general)

    shortcut = e.op("Or", special, trig)
    degree = ctx.where(shortcut, ctx.i(1), ctx.n)
    result = _run_recurrence(ctx, _Recurrence(c_fixed=two_z), first, degree)
    result = ctx.where(ctx.n_is(1), first, result)
    result = ctx.where(ctx.n_is(0), one, result)
    result = ctx.where(trig, trig_value, result)
    result = ctx.where(special, special_value, result)
    return ctx.where(e.op("Less", ctx.n, ctx.i(0)), zero, result)


def _hermite(ctx: _Context, physicists: bool) -> Any:
    """Hermite polynomials, physicists' (``H``) or probabilists' (``He``)."""
    e = ctx.e
    x = ctx.x
    one, zero = ctx.c(1.0), ctx.c(0.0)
    limit = _HERMITE_LIMIT[ctx.t.name]
    first = e.op("Add", x, x) if physicists else x
    rec = _Recurrence(c_fixed=first, d=_step_two_j if physicists else _step_degree)
    too_high = ctx.n_above(limit)
    degree = ctx.where(too_high, ctx.i(1), ctx.n)
    result = _run_recurrence(ctx, rec, first, degree)
    result = ctx.where(too_high, ctx.c(math.nan), result)
    result = ctx.where(ctx.n_is(1), first, result)
    result = ctx.where(ctx.n_is(0), one, result)
    return ctx.where(e.op("Less", ctx.n, ctx.i(0)), zero, result)


def _laguerre(ctx: _Context) -> Any:
    """Laguerre polynomials."""
    e = ctx.e
    x = ctx.x
    one, zero = ctx.c(1.0), ctx.c(0.0)
    first = e.op("Sub", one, x)

    def c_step(ctx: _Context, e: _Emitter, j: Any) -> Any:
        return e.op("Add", _step_two_j(ctx, e, j), first)

    at_zero = e.op("Equal", x, zero)
    degree = ctx.where(at_zero, ctx.i(1), ctx.n)
    result = _run_recurrence(ctx, _Recurrence(c_step=c_step, d=_step_degree, e=_step_j_plus_1), first, degree)
    result = ctx.where(ctx.n_is(1), first, result)
    result = ctx.where(ctx.n_is(0), one, result)
    result = ctx.where(at_zero, one, result)
    return ctx.where(e.op("Less", ctx.n, ctx.i(0)), zero, result)


def _legendre(ctx: _Context) -> Any:
    """Legendre polynomials."""
    import onnx_ir as ir

    e = ctx.e
    x = ctx.x
    one, zero = ctx.c(1.0), ctx.c(0.0)

    def c_step(ctx: _Context, e: _Emitter, j: Any) -> Any:
        two_j_plus_1 = e.op("Add", e.op("Add", j, j), e.const(1, ir.DataType.INT64))
        return e.op("Mul", e.op("Cast", two_j_plus_1, to=ctx.t), x)

    special = e.op("Equal", e.op("Abs", x), one)
    up_or_even = e.op("Or", e.op("Greater", x, zero), ctx.even())
    degree = ctx.where(special, ctx.i(1), ctx.n)
    result = _run_recurrence(ctx, _Recurrence(c_step=c_step, d=_step_degree, e=_step_j_plus_1), x, degree)
    result = ctx.where(ctx.n_is(1), x, result)
    result = ctx.where(ctx.n_is(0), one, result)
    result = ctx.where(special, ctx.signed(up_or_even, one), result)
    return ctx.where(e.op("Less", ctx.n, ctx.i(0)), zero, result)


def _evaluate(name: str, ctx: _Context) -> Any:
    if name.startswith("hermite"):
        return _hermite(ctx, physicists=name.endswith("_h"))
    if name.startswith("laguerre"):
        return _laguerre(ctx)
    if name.startswith("legendre"):
        return _legendre(ctx)
    return _chebyshev(ctx, kind=name[-1], shifted=name.startswith("shifted"))


def _result_type(x: Any, n: Any) -> Any:
    """The ONNX type of PyTorch's result for operands ``x`` and ``n`` (values or numbers)."""
    import onnx_ir as ir

    def dtype(v: Any) -> torch.dtype:
        if isinstance(v, ir.Value):
            if v.dtype is None:
                raise TypeError("operand of unknown type")
            return {ir.DataType.BOOL: torch.bool}.get(v.dtype) or getattr(torch, v.dtype.numpy().name)
        return torch.tensor(v).dtype

    tensors = [dtype(v) for v in (x, n) if isinstance(v, ir.Value)]
    numbers = [dtype(v) for v in (x, n) if not isinstance(v, ir.Value)]
    result = tensors[0] if len(tensors) == 1 else torch.promote_types(*tensors)
    for number in numbers:
        if number.is_floating_point and not result.is_floating_point:
            result = torch.get_default_dtype()
    if not result.is_floating_point:
        result = torch.get_default_dtype()
    if result == torch.float32:
        return ir.DataType.FLOAT
    if result == torch.float64:
        return ir.DataType.DOUBLE
    raise TypeError(f"no polynomial kernel for {result}")


def _translation(name: str) -> Callable[[Any, Any], Any]:
    def translate(x: Any, n: Any) -> Any:
        import onnx_ir as ir

        e = translation_emitter(name)
        t = _result_type(x, n)

        def operand(v: Any) -> Any:
            if isinstance(v, ir.Value):
                return v
            if isinstance(v, bool) or isinstance(v, int):
                return e.const(int(v), ir.DataType.INT64)
            return e.const(float(v), ir.DataType.DOUBLE)

        return _evaluate(name, _Context(e, operand(x), operand(n), t))

    translate.__name__ = f"ort_lazy_{name}"
    translate.__qualname__ = translate.__name__
    translate.__doc__ = f"``torch.special.{name}`` for the exporter's translator."
    return translate


#: the translations, by aten overload
TRANSLATIONS: dict[torch._ops.OpOverload, Callable[[Any, Any], Any]] = {
    op: _translation(op._schema.name.split("::", 1)[1].removeprefix("special_")) for op in POLYNOMIAL_OPS
}

"""Max pooling with PyTorch's indices from one ONNX ``MaxPool``.

ONNX ``MaxPool`` numbers its indices over the whole tensor (``(n * C + c) * H * W + h * W + w``,
padding not counted); PyTorch numbers them within each plane (``h * W + w``). The exporter's
translation converts one to the other with a second, full-size ``MaxPool`` (kernel 1) whose
indices give each plane's offset; with ORT, a ``MaxPool`` that outputs indices takes its
generic kernel, so training-mode max pooling cost two slow passes over the input (ResNet-18's
stem pooling: 36 ms forward against eager's 7). Here the offset is removed by ``Mod`` with the
plane size: one pooling. Ties and windows are ONNX's, which are PyTorch's (the first maximum
of a window in row-major order; ceil mode and dilation as attributes).

Eager's NaN rule (a window holding a NaN gives NaN and the index of its last NaN; ORT's
``MaxPool`` skips NaN, so a NaN from a diverging layer vanished where eager passes it on) is
kept here for every float type: one more pooling, of the NaN mask times each element's position
plus one, finds those windows (its maximum is, as in eager's scan, the last NaN's position plus
one: the index, read from the value, so that pooling needs no indices), and a ``Where`` puts
them in. That is four passes over the input and one over the output of ORT's slowest
elementwise kernel (ResNet-18 inference: ~1.8 of 40 ms), for a case that needs a NaN: for
float32/float64 an ONNX ``If`` runs it only when the input's sum is NaN (any NaN, or
infinities of both signs), plain ``MaxPool`` otherwise. The same holds for plain max pooling
(``max_pool2d``/``3d``, what inference graphs use:
:func:`ort_lazy.lowering.pooling.drop_unused_indices`). The ``If`` also keeps ORT from
fusing across the pooling in its blocked (NCHWc) layout: ResNet-18's region at 224 x 224 ran
17.6 ms with it, 16.9 ms without (four layout reorders and two unfused Add/ReLU pairs). So
where the caller can run a call in PyTorch instead (:func:`checked`, the CPU regions of
:func:`~ort_lazy.export.fx.export_graph`), the model has no ``If``: plain ``MaxPool``, and the
flag "the input's sum is NaN" becomes one of its check outputs
(:attr:`~ort_lazy.specs.OrtModel.checks`); a call that raises it runs in PyTorch, and a
region whose calls keep raising it takes the ``If`` form (``OrtRegion._take_exact_forms``). The
``fast_math`` option translates without the rule (:func:`nan_rule`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .emitter import Emitter, translation_emitter

__all__ = ["TRANSLATIONS", "checked", "nan_rule"]

_aten = torch.ops.aten

#: whether max pooling translates with eager's NaN rule (:func:`nan_rule`)
_NAN_RULE: contextvars.ContextVar[bool] = contextvars.ContextVar("ort_lazy_max_pool_nan_rule", default=True)


#: the flags of the translation running in :func:`checked` (None: no caller reads flags)
_CHECKS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("ort_lazy_pooling_checks", default=None)


@contextlib.contextmanager
def checked() -> Iterator[list[Any]]:
    """Translate float32/float64 max pooling inside the block without the ``If`` of eager's NaN
    rule: each pooling adds its flag "the input may hold a NaN" (a boolean ``onnx_ir`` value)
    to the list yielded, which the caller makes a model output and reads after each run,
    running the call in PyTorch when one is set."""
    flags: list[Any] = []
    token = _CHECKS.set(flags)
    try:
        yield flags
    finally:
        _CHECKS.reset(token)


@contextlib.contextmanager
def nan_rule(keep: bool) -> Iterator[None]:
    """Translate max pooling inside the block with eager's NaN rule (``keep``, the default
    outside any block) or without it (the ``fast_math`` option: ORT's ``MaxPool`` alone, which
    may give a number for a window holding a NaN)."""
    token = _NAN_RULE.set(keep)
    try:
        yield
    finally:
        _NAN_RULE.reset(token)


def _per_dim(value: int | Sequence[int], dims: int) -> list[int]:
    values = [int(value)] if isinstance(value, int) else [int(v) for v in value]
    return values * dims if len(values) == 1 else values


def _nan_rule(
    e: Any, x: Any, values: Any, indices: Any | None, spatial: Any, plane: Any, pool: dict[str, Any]
) -> tuple[Any, Any | None]:
    """``values`` (and ``indices``) with eager's NaN rule; for float32/float64 ``x`` its work sits
    in an ``If`` taken only when ``x`` may hold a NaN (see the module docstring)."""
    import onnx_ir as ir

    t = x.dtype
    given = [values] if indices is None else [values, indices]

    def nan_rule(n: Emitter) -> list[Any]:
        one = n.op("Constant", value_ints=[1])
        # float32 holds every position exactly up to 2**24 per plane
        start = n.op("Squeeze", one)
        numbers = n.op("Range", start, n.op("Squeeze", n.op("Add", plane, one)), start)  # 1 .. plane size
        positions = n.op("Reshape", n.op("Cast", numbers, to=ir.DataType.FLOAT), spatial)
        mask = n.op("Mul", n.op("Cast", n.op("IsNaN", x), to=ir.DataType.FLOAT), positions)
        last_nan = n.op("MaxPool", mask, **pool)
        found = n.op("Greater", last_nan, n.const(0.0, ir.DataType.FLOAT))
        outputs = [n.op("Where", found, n.const(float("nan"), t), values)]
        if indices is not None:
            nan_index = n.op("Cast", n.op("Sub", last_nan, n.const(1.0, ir.DataType.FLOAT)), to=ir.DataType.INT64)
            outputs.append(n.op("Where", found, nan_index, indices))
        return outputs

    if t in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        flags = _CHECKS.get()
        if flags is not None:  # the caller reads the flag: plain pooling here
            flag = _nan_flag(e, x) if t == ir.DataType.FLOAT else e.op("IsNaN", e.op("ReduceSum", x, keepdims=0))
            flag.dtype, flag.shape = ir.DataType.BOOL, ir.Shape([])
            flags.append(flag)
            return values, indices
        may_hold_nan = e.op("IsNaN", e.op("ReduceSum", x, keepdims=0))
        outs = e.branch(may_hold_nan, nan_rule, lambda _: given)
    else:  # float16/bfloat16: unguarded (their widening to float32 does not reach into an If)
        outs = nan_rule(e)
    for new, old in zip(outs, given):
        new.dtype, new.shape = old.dtype, old.shape
    return outs[0], (outs[1] if indices is not None else None)


def _nan_flag(e: Any, x: Any) -> Any:
    """"The float32 ``x`` may hold a NaN" (its sum is NaN) as a 0-d boolean, in ops every
    provider's reader takes. The plane sums first: ORT's CPU provider runs GlobalAveragePool in
    its blocked layout, where a ReduceSum would first convert the whole input back (CNN of
    models.py: 0.4 of 1.3 ms). The sum keeps its dims and is compared with itself: OpenVINO
    takes neither a reduction to 0-d nor ``IsNaN``, and left both to ORT's CPU provider."""
    total = e.op("ReduceSum", e.op("GlobalAveragePool", x), keepdims=1)
    return e.op("Reshape", e.op("Not", e.op("Equal", total, total)), e.op("Constant", value_ints=[]))


def _translation(dims: int, with_indices: bool) -> Callable[..., Any]:
    name = f"max_pool{dims}d{'_with_indices' if with_indices else ''}"

    def translate(
        self: Any,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
    ) -> Any:
        import onnx_ir as ir

        e = translation_emitter(name)
        if self.shape is None:
            raise ValueError("max pooling needs the input's rank")
        kernel = _per_dim(kernel_size, dims)
        strides = _per_dim(stride, dims) if stride else kernel
        pads = _per_dim(padding, dims)
        pool = {
            "kernel_shape": kernel,
            "strides": strides,
            "pads": pads + pads,
            "dilations": _per_dim(dilation, dims),
            "ceil_mode": int(bool(ceil_mode)),
        }
        unbatched = len(self.shape) == dims + 1
        x = e.op("Unsqueeze", self, e.op("Constant", value_ints=[0])) if unbatched else self
        x.dtype = self.dtype
        floats = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
        rule = self.dtype in floats and _NAN_RULE.get()  # eager's NaN rule applies
        if with_indices or rule:
            spatial = e.op("Shape", x, start=2, end=2 + dims)
            plane = e.op("ReduceProd", spatial, keepdims=1)  # elements per plane, shape [1]
        indices = None
        if with_indices:
            values, flat = e.op("MaxPool", x, num_outputs=2, **pool)
            indices = e.op("Mod", flat, plane)
            indices.dtype = ir.DataType.INT64
        else:
            values = e.op("MaxPool", x, **pool)
        values.dtype = self.dtype
        if rule:
            values, indices = _nan_rule(e, x, values, indices, spatial, plane, pool)
        if unbatched:
            axes = e.op("Constant", value_ints=[0])
            values = e.op("Squeeze", values, axes)
            indices = e.op("Squeeze", indices, axes) if indices is not None else None
        values.dtype = self.dtype
        if indices is None:
            return values
        indices.dtype = ir.DataType.INT64
        return values, indices

    translate.__name__ = translate.__qualname__ = f"ort_lazy_{name}"
    return translate


#: the translations, by aten overload
TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    _aten.max_pool2d_with_indices.default: _translation(2, with_indices=True),
    _aten.max_pool3d_with_indices.default: _translation(3, with_indices=True),
    _aten.max_pool2d.default: _translation(2, with_indices=False),
    _aten.max_pool3d.default: _translation(3, with_indices=False),
}

"""Helpers the rewrite modules share.

A rewrite that declines a call returns ``NotImplemented``: the op stays whole and goes to the
exporter's translation. Where a rewrite replaces an op that torch also decomposes, the calls it
leaves alone take torch's own decomposition (:func:`_torch_decomposition`). float16 / bfloat16
ops that eager's kernels compute in float32 and round once are written so
(:func:`_in_float32`); float64 ops whose translation holds a Python float as a float32 constant
are rewritten for float64 only (:func:`_float64_only`).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

__all__ = ["_aten", "_HALF", "_concrete", "_torch_decomposition", "_float64_only", "_in_float32"]


_aten = torch.ops.aten


#: float types eager computes in float32 (its ``opmath``) and rounds once
_HALF = (torch.float16, torch.bfloat16)


def _concrete(*values: Any) -> bool:
    return all(isinstance(v, int) for v in values)


def _torch_decomposition(op: Any, *args: Any) -> Any:
    """PyTorch's own decomposition of ``op`` (for cases the rewrites here leave alone)."""
    return torch._decomp.decomposition_table[op](*args)


# float64 ops whose translation holds a Python float as a float32 constant (ONNX's value_float
# attribute and torchlib's scalar constants are float32): deg2rad was 8e-9 off relative, celu
# 1.4e-6, fmod(x, 1.1) 1.7e-6, sinc near its roots 2.8e-8 absolute. Written with the scalars
# as operands of aten arithmetic, which the exporter keeps in the tensor's dtype, and in eager's
# order of operations.
def _float64_only(fn: Any) -> Any:
    """``fn`` for float64 inputs; other dtypes keep the exporter's translation (NotImplemented)."""

    def decompose(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float64:
            return NotImplemented
        return fn(x, *args, **kwargs)

    decompose.__doc__ = fn.__doc__
    return decompose


def _half_value(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to float16 / bfloat16 (to nearest, ties to even), in plain Python: a
    tensor made while tracing would enter the graph."""
    if dtype == torch.float16:
        try:
            return float(struct.unpack("<e", struct.pack("<e", value))[0])
        except (OverflowError, struct.error):  # past float16's range
            return math.copysign(math.inf, value)
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    if (bits >> 23) & 0xFF == 0xFF:  # inf / NaN
        return value
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _in_float32(op: Any, scalars: tuple[str, ...] = ()) -> Any:
    """``op`` of float16 / bfloat16 tensors (all of one dtype) computed in float32 and rounded
    once, as eager's kernels compute it (step by step in the half type, an intermediate rounds
    or overflows: ``addcmul``/``addcdiv``/``lerp`` gave inf where eager's results are finite, a
    scaled ``add`` cancelled 24 steps off); with ``scalars`` named, only where one of those
    keyword arguments is not 1 (a plain ``add`` is one rounding either way), and those rounded
    to the half type first, as eager's kernels take them (``add``'s ``alpha``)."""

    def decompose(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or tensors[0].dtype not in _HALF or any(t.dtype != tensors[0].dtype for t in tensors):
            return NotImplemented
        if scalars and all(kwargs.get(name, 1) == 1 for name in scalars):
            return NotImplemented
        for name in scalars:
            if isinstance(kwargs.get(name), (int, float)) and not isinstance(kwargs[name], bool):
                kwargs[name] = _half_value(float(kwargs[name]), tensors[0].dtype)
        wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        return op(*wide, **kwargs).to(tensors[0].dtype)

    return decompose

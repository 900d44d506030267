"""Symbolic numbers (``SymInt``/``SymFloat``) that tensor ops read, as typed 0-d tensors.

With dynamic shapes a graph computes numbers from its sizes (``x.shape[0] / 3``, the element
count a mean divides by) and hands them to tensor ops. The exporter gives every symbolic float
the ONNX type ``FLOAT`` and its translations assume Python constants for ``Scalar`` arguments, so:

- a float64 computation read the number rounded to float32 (``x * (n / 3)`` 1e-7 off eager's),
- ``prims`` ops, which the type-promotion pass does not see, mixed ``FLOAT`` with the tensor's
  type (``prims.div(x, n)`` of a float64 or float16 batch norm with a dynamic batch: ill-typed,
  left to PyTorch),
- a ``Scalar`` overload given a symbolic number failed to translate (``x ** (n / 7)``).

:func:`typed_symbolic_scalars` rewrites such uses before translation: a ``Scalar`` overload
becomes its ``Tensor`` overload, and the number becomes ``scalar_tensor(n, dtype)`` of the type
the op computes in, and a symbolic float enters the graph as a float64 input
(``export.promotion._double_symbolic_inputs``), so float64 ops read eager's double.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import _compat

__all__ = ["typed_symbolic_scalars"]

_aten = torch.ops.aten
_prims = torch.ops.prims

#: ``Scalar`` overloads -> the overload taking a tensor in that place
_TENSOR_OVERLOADS = {
    _aten.add.Scalar: _aten.add.Tensor,
    _aten.sub.Scalar: _aten.sub.Tensor,
    _aten.mul.Scalar: _aten.mul.Tensor,
    _aten.div.Scalar: _aten.div.Tensor,
    _aten.rsub.Scalar: _aten.rsub.Tensor,
    _aten.pow.Tensor_Scalar: _aten.pow.Tensor_Tensor,
    _aten.remainder.Scalar: _aten.remainder.Tensor,
    _aten.fmod.Scalar: _aten.fmod.Tensor,
    _aten.eq.Scalar: _aten.eq.Tensor,
    _aten.ne.Scalar: _aten.ne.Tensor,
    _aten.lt.Scalar: _aten.lt.Tensor,
    _aten.le.Scalar: _aten.le.Tensor,
    _aten.gt.Scalar: _aten.gt.Tensor,
    _aten.ge.Scalar: _aten.ge.Tensor,
}

#: arithmetic whose integer tensor operands a floating result converts first (the exporter's
#: type promotion leaves ``pow``'s base integer: ``Pow`` of an int64 base gave int64)
_ARITHMETIC = {_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor, _aten.rsub.Tensor,
               _aten.pow.Tensor_Tensor, _aten.remainder.Tensor, _aten.fmod.Tensor}

#: aten ops whose ``Tensor`` overload takes a symbolic number as a tensor operand
_TENSOR_OPERAND_OPS = set(_TENSOR_OVERLOADS.values()) | {
    _aten.where.self, _aten.maximum.default, _aten.minimum.default,
    _aten.clamp.Tensor, _aten.clamp_min.Tensor, _aten.clamp_max.Tensor,
}


def _is_symbolic_number(arg: Any) -> bool:
    return isinstance(arg, torch.fx.Node) and isinstance(
        arg.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)
    )


def _operand_dtypes(node: torch.fx.Node) -> list[torch.dtype]:
    """The dtypes of ``node``'s tensor arguments, in order."""
    vals = [arg.meta.get("val") for arg in node.args if isinstance(arg, torch.fx.Node)]
    return [val.dtype for val in vals if isinstance(val, torch.Tensor)]


def _tensor_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype the op computes in: its first tensor operand's for ``prims`` ops (which take
    operands of one dtype), else its result's; for a comparison, a floating operand's (else
    type promotion decides: None)."""
    if node.target.namespace == "prims":
        return next(iter(_operand_dtypes(node)), None)
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    if val.dtype != torch.bool:
        return val.dtype
    return next((d for d in _operand_dtypes(node) if d.is_floating_point), None)


def _number_dtype(number: Any) -> torch.dtype:
    """The dtype PyTorch gives a Python number of ``number``'s kind."""
    if isinstance(number, torch.SymFloat):
        return torch.float32
    return torch.bool if isinstance(number, torch.SymBool) else torch.int64


def _typed(graph: torch.fx.Graph, target: Any, args: tuple, kwargs: dict, val: Any) -> torch.fx.Node:
    """A new ``call_function`` node (at the graph's insertion point) with ``meta["val"]``."""
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = val
    return node


def typed_symbolic_scalars(gm: torch.fx.GraphModule) -> int:
    """Give each symbolic number a tensor op reads the type the op computes in (in place).

    For every ``aten`` op whose ``Tensor`` overload takes tensors there, and every ``prims`` op,
    a symbolic-number argument becomes ``scalar_tensor(n, dtype)`` (a ``Scalar`` overload turns
    into its ``Tensor`` overload first). Symbolic numbers are computed in PyTorch (ops with a
    symbolic result never join a region), so each is a graph input here, which
    :func:`~ort_lazy.export.fx.translate` binds as float64 where it is a float. Returns how many
    arguments were rewritten.
    """
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not any(_is_symbolic_number(a) for a in node.args):
            continue
        target = _TENSOR_OVERLOADS.get(node.target, node.target)
        if target not in _TENSOR_OPERAND_OPS and node.target.namespace != "prims":
            continue
        dtype = _tensor_dtype(node)
        args = list(node.args)
        with gm.graph.inserting_before(node):
            for i, arg in enumerate(args):
                if _is_symbolic_number(arg):
                    kind = dtype or _number_dtype(arg.meta["val"])
                    with _compat.real_tensor_mode():
                        val = torch.empty((), dtype=kind)
                    args[i] = _typed(gm.graph, _aten.scalar_tensor.default, (arg,), {"dtype": kind}, val)
                    rewritten += 1
            if target in _ARITHMETIC and dtype is not None and dtype.is_floating_point:
                for i, arg in enumerate(args):
                    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
                    if isinstance(val, torch.Tensor) and not val.is_floating_point():
                        # a fake tensor's conversion stays fake
                        args[i] = _typed(gm.graph, _prims.convert_element_type.default, (arg, dtype), {}, val.to(dtype))
        node.target = target
        node.args = tuple(args)
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten

"""Numbers as eager computes them, around the translation of an aten FX graph (:mod:`.fx`).

Before: a prepared copy of the graph (:func:`_prepare`) with type promotion made explicit,
symbolic numbers typed as the ops reading them compute, factories given the dtype they made,
float16 / bfloat16 products and quotients by Python floats computed in float32, and float64
arithmetic on Python floats float32 cannot hold given those floats as exact placeholders
(:func:`_exact_double_scalars`). After: float64 computations given back the Python floats the
translator rounded to float32 constants, and Python-float graph inputs read as float64.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx

from .. import _compat
from .symbolic import typed_symbolic_scalars

__all__: list[str] = []


_aten = torch.ops.aten
#: float64 arithmetic whose Python-float second operand is given to the translator as a
#: tensor instead: op -> the overload taking a tensor there
_SCALAR_ARITHMETIC = {
    _aten.add.Tensor: _aten.add.Tensor, _aten.add.Scalar: _aten.add.Tensor,
    _aten.sub.Tensor: _aten.sub.Tensor, _aten.sub.Scalar: _aten.sub.Tensor,
    _aten.mul.Tensor: _aten.mul.Tensor, _aten.mul.Scalar: _aten.mul.Tensor,
    _aten.div.Tensor: _aten.div.Tensor, _aten.div.Scalar: _aten.div.Tensor,
    _aten.rsub.Scalar: _aten.rsub.Tensor,
    _aten.pow.Tensor_Scalar: _aten.pow.Tensor_Tensor,
}


#: ops that take the promoted scalar as an ordinary tensor operand
_TENSOR_OPERANDS = set(_SCALAR_ARITHMETIC.values()) | {
    _aten.where.self, _aten.maximum.default, _aten.minimum.default, _aten.pow.Tensor_Tensor,
    _aten.eq.Tensor, _aten.ne.Tensor, _aten.lt.Tensor, _aten.le.Tensor, _aten.gt.Tensor, _aten.ge.Tensor,
    _aten.clamp.Tensor, _aten.clamp_min.Tensor, _aten.clamp_max.Tensor,
}


def _exact_double_scalars(gm: torch.fx.GraphModule) -> dict[int, torch.Tensor]:
    """Keep float64 arithmetic on Python floats exact (in place on a prepared copy).

    The translator makes Python floats float32 constants, so ``x * 0.35355339059327373`` on
    float64 would compute with 0.35355338 (relative error 3e-8). Each such operand that float32
    cannot hold exactly becomes a placeholder (after the graph's own when those come first); the
    returned {placeholder position: 0-d float64 tensor} is baked into the model as initializers
    of those exact values.
    """
    first = next((n for n in gm.graph.nodes if n.op != "placeholder"), None)
    if first is None:
        return {}
    values: dict[torch.fx.Node, torch.Tensor] = {}

    def holder_for(value: float, device: torch.device) -> torch.fx.Node:
        with gm.graph.inserting_before(first):  # ahead of every use
            holder = gm.graph.placeholder(f"double_scalar_{len(values)}")
        with _compat.real_tensor_mode():
            holder.meta["val"] = torch.empty((), dtype=torch.float64, device=device)
            values[holder] = torch.tensor(value, dtype=torch.float64)
        return holder

    def inexact(value: Any) -> bool:
        return type(value) is float and float(np.float32(value)) != value

    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype != torch.float64:
            continue
        # type promotion turns a float operand into scalar_tensor(value)
        if node.target is _aten.scalar_tensor.default:
            if not inexact(node.args[0]) or any(
                u.op != "call_function" or u.target not in _TENSOR_OPERANDS for u in node.users
            ):
                continue  # exact in float32, or a user that wants a Python scalar there
            node.replace_all_uses_with(holder_for(node.args[0], val.device))
            if node is first:
                first = node.next  # holders go before the first node still in the graph
            gm.graph.erase_node(node)
            continue
        target = _SCALAR_ARITHMETIC.get(node.target)
        if target is not None and len(node.args) >= 2 and inexact(node.args[1]):
            node.target = target
            node.args = (node.args[0], holder_for(node.args[1], val.device), *node.args[2:])
    if not values:
        return {}
    gm.recompile()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {i: values[p] for i, p in enumerate(placeholders) if p in values}


def _python_floats(gm: torch.fx.GraphModule) -> dict[float, float]:
    """{float32 rounding: value} of the Python floats in ``gm``'s arguments that float32 cannot
    hold, where no other of them rounds to the same float32: neither an inexact one nor one
    float32 holds exactly (``3.1415927410125732`` beside ``math.pi``: a constant of that value
    may be either, and taking it for pi computed float32 digamma 3% off near its poles)."""
    seen: dict[float, set[float]] = {}

    def visit(value: Any) -> None:
        if isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif type(value) is float and math.isfinite(value):
            seen.setdefault(float(np.float32(value)), set()).add(value)

    for node in gm.graph.nodes:
        if node.op == "call_function":
            visit(node.args)
            visit(tuple(node.kwargs.values()))
    single = {rounded: next(iter(values)) for rounded, values in seen.items() if len(values) == 1}
    return {rounded: value for rounded, value in single.items() if value != rounded}


def _restore_double_constants(model: Any, gm: torch.fx.GraphModule) -> int:
    """Give float64 computations back the Python floats the translator rounded to float32.

    torchlib makes a Python-float argument a float32 ``Constant`` and casts it to the tensor's
    type (``Cast(to=DOUBLE)`` / ``CastLike(c, x)``): ``full_like(x, 1.1)``, ``add(.., alpha=1.1)``,
    ``masked_fill``, ``1.1 ** x``, clamp bounds, activation parameters, every op at once. A
    scalar float32 constant whose value is the float32 rounding of exactly one Python float of
    the graph becomes that float as a double for the uses that are such casts (its other uses
    keep the float32 constant).
    Returns how many constants were restored.
    """
    import onnx_ir as ir

    exact = _python_floats(gm)
    if not exact:
        return 0
    found = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            continue
        attr = node.attributes.get("value")
        if attr is None or not isinstance(attr.value, ir.TensorProtocol):
            continue
        tensor = attr.value
        if tensor.dtype != ir.DataType.FLOAT or tensor.shape.dims != ():
            continue
        value = exact.get(float(tensor.numpy()))
        if value is not None:
            found.append((node, value))
    restored = 0
    for node, value in found:
        uses = list(node.outputs[0].uses())
        doubles = [use for use in uses if _casts_to_double(model, use[0], use[1])]
        if not doubles:
            continue
        double = ir.AttrTensor("value", ir.tensor(np.array(value, dtype=np.float64)))
        if len(doubles) == len(uses):
            node.attributes["value"] = double
        else:  # one constant shared with float32 uses (the translator dedupes): a second one
            twin = ir.Node("", "Constant", [], attributes=[double], num_outputs=1)
            node.graph.insert_after(node, twin)
            for use in doubles:
                use[0].replace_input_with(use[1], twin.outputs[0])
        restored += 1
    return restored


def _double_symbolic_inputs(model: Any, gm: torch.fx.GraphModule) -> int:
    """Make the graph's Python-float inputs float64 (in place; returns how many).

    A region reads a symbolic float PyTorch computed from the sizes (``n / 3`` in ``x * (n /
    3)``) as an input, which the translator types float32: a float64 op then read it rounded
    (1e-7 off eager's). The input becomes float64 (:func:`spec_of` binds it so); each use that
    only casts it to float64 reads it whole, any other use a float32 copy, as translated.
    """
    import onnx_ir as ir

    names = {
        n.name for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), (float, torch.SymFloat))
    }
    changed = 0
    for value in model.graph.inputs:
        if value.name not in names or value.dtype != ir.DataType.FLOAT:
            continue
        others = [use for use in value.uses() if not _casts_to_double(model, use[0], use[1])]
        value.dtype = ir.DataType.DOUBLE
        if others:
            cast = ir.Node("", "Cast", [value], attributes=[ir.AttrInt64("to", ir.DataType.FLOAT)], num_outputs=1)
            cast.outputs[0].dtype = ir.DataType.FLOAT
            cast.outputs[0].shape = ir.Shape([])
            model.graph.insert_before(next(iter(model.graph)), cast)  # others: the graph has nodes
            for user, index in others:
                user.replace_input_with(index, cast.outputs[0])
        changed += 1
    return changed


def _casts_to_double(model: Any, user: Any, index: int, call: Any = None) -> bool:
    """Whether ``user``'s input ``index`` is only cast to float64: ``Cast(to=DOUBLE)``,
    ``CastLike`` to a value typed double, or a local function (torchlib's) whose parameter there
    is only so cast (``CastLike`` against a parameter typed double at ``call``, the call site)."""
    import onnx_ir as ir

    if user.domain in ("", "ai.onnx"):
        if index != 0:
            return False
        if user.op_type == "Cast":
            to = user.attributes.get("to")
            return to is not None and to.value == ir.DataType.DOUBLE
        if user.op_type != "CastLike" or user.inputs[1] is None:
            return False
        like = user.inputs[1]
        if call is not None:  # inside a function: the parameter's type is the call site's
            position = next((i for i, p in enumerate(call[1]) if p is like), None)
            like = call[0].inputs[position] if position is not None and position < len(call[0].inputs) else None
        return like is not None and like.dtype == ir.DataType.DOUBLE
    function = model.functions.get((user.domain, user.op_type, user.overload))
    if call is not None or function is None or index >= len(function.inputs):
        return False  # one level of functions: torchlib's do not call each other here
    params = list(function.inputs)
    uses = list(params[index].uses())
    return bool(uses) and all(_casts_to_double(model, u[0], u[1], (user, params)) for u in uses)


def _prepare(gm: torch.fx.GraphModule, providers: Sequence[str] | None = None) -> torch.fx.GraphModule:
    """A copy with explicit type promotion (symbolic numbers typed as the ops reading them
    compute, low-precision arithmetic on Python floats as eager computes it)."""
    graph = copy.deepcopy(gm.graph)
    out = torch.fx.GraphModule(gm, graph)
    for node in out.graph.nodes:
        node.meta.pop("stack_trace", None)
    typed_symbolic_scalars(out)
    _explicit_factory_dtypes(out)
    _wide_low_precision_scalars(out, cpu=bool(providers) and set(providers) == {"CPUExecutionProvider"})
    _compat.insert_type_promotion(out)
    return out


#: float16 / bfloat16 products and quotients with a Python-float operand (the tensor first).
#: Eager's CPU kernels keep that number in float32 for these; for ``add`` / ``sub`` / ``rsub``
#: they round it to the tensor's type first, as the translation does, so those are not listed.
_LOW_PRECISION_SCALAR_ARITHMETIC = {
    _aten.mul.Tensor, _aten.mul.Scalar, _aten.div.Tensor, _aten.div.Scalar,
    _aten.div.Tensor_mode, _aten.div.Scalar_mode,
}
_HALF_NORMAL = (float(torch.finfo(torch.float16).tiny), float(torch.finfo(torch.float16).max))


def _wide_low_precision_scalars(gm: torch.fx.GraphModule, cpu: bool) -> int:
    """float16 / bfloat16 products and quotients by a Python float the type cannot hold
    computed in float32 (in place; returns how many).

    Eager computes ``half * s`` and ``half / s`` in float32 with ``s`` in float32 (its "opmath"
    type); the translation rounds ``s`` to the tensor's type first. For float16 outside its
    normal range that is wrong outright: ``x / 1e5`` divided by infinity (0 where eager gives
    x * 1e-5), a subnormal ``s`` such as ``1e-6`` kept 1-2 digits (1% off). Inside the range it
    costs up to one step of the result (``x * 0.1``). ``cpu``: ORT's CPU provider has no float16 or
    bfloat16 arithmetic kernels and computes these in float32 between casts anyway, so every
    inexact ``s`` gets eager's exact result at no cost; other providers have native kernels,
    and only float16's out-of-range numbers are widened there.
    """
    changed = 0
    low, high = _HALF_NORMAL
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _LOW_PRECISION_SCALAR_ARITHMETIC or len(node.args) < 2:
            continue
        x, s = node.args[0], node.args[1]
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in (torch.float16, torch.bfloat16) or type(s) is not float:
            continue
        if not isinstance(x, torch.fx.Node) or getattr(x.meta.get("val"), "dtype", None) != val.dtype:
            continue
        if not math.isfinite(s) or float(torch.tensor(s, dtype=val.dtype)) == s:
            continue  # exact in the tensor's type
        out_of_range = val.dtype == torch.float16 and s != 0 and not low <= abs(s) <= high
        if not (cpu or out_of_range):
            continue
        graph = gm.graph
        with graph.inserting_before(node):
            wide = graph.call_function(_aten._to_copy.default, (x,), {"dtype": torch.float32})
            wide.meta["val"] = x.meta["val"].to(torch.float32)
            op = graph.call_function(node.target, (wide, s, *node.args[2:]), dict(node.kwargs))
            op.meta["val"] = val.to(torch.float32)
            back = graph.call_function(_aten._to_copy.default, (op,), {"dtype": val.dtype})
            back.meta["val"] = val
        node.replace_all_uses_with(back)
        graph.erase_node(node)
        changed += 1
    return changed


def _explicit_factory_dtypes(gm: torch.fx.GraphModule) -> int:
    """Factory ops (no tensor operand) without a ``dtype`` get the one they made (in place;
    returns how many).

    With ``dtype=None`` a factory makes torch's default dtype (``torch.set_default_dtype``),
    while the exporter's translations assume float32: under a float64 default, ``full``,
    ``ones``, ``zeros``, ``empty``, ``randn``, ``linspace`` and ``scalar_tensor`` were
    ill-typed (left to PyTorch).
    """
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or node.kwargs.get("dtype") is not None:
            continue
        if not any(a.name == "dtype" and a.kwarg_only for a in node.target._schema.arguments):
            continue
        operands = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
        if any(isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) for a in operands):
            continue
        node.kwargs = {**node.kwargs, "dtype": val.dtype}
        changed += 1
    return changed

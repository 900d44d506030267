"""Sums over leading axes as a matrix product with a row of ones, for ORT's CPU provider.

ORT's CPU ``ReduceSum`` over the leading axes of a tensor (the bias gradient of every linear
layer, ``sum(grad, [0])``; the weight and bias gradients of layer norm, ``sum(g, [0, 1])``) is
slow, and slower on two threads than on one: a [394, 192] gradient takes 38 us on 2 cores, the
same sum as ``MatMul(ones[1, 394], x)`` 10 us (torch: 8 us); [4096, 16] 174 against 9 us,
[100000, 4] 2.2 ms against 0.23 ms. :func:`leading_sums_as_matmul` rewrites those nodes:
``Reshape`` to ``[M, N]`` (free), ``MatMul`` with ``ones[1, M]`` (a ``ConstantOfShape``, folded by
ORT when the session is made), ``Reshape`` to the sum's shape. float32 and float64 only, static
shapes only; the CPU provider only (CUDA's ``MatMul`` may round through TF32, its reduction
kernels are not slow). The order of the float additions differs from ``ReduceSum``'s (as it
does between any two kernels); values agree with eager within the usual reduction tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .emitter import take_output_name

__all__ = ["leading_sums_as_matmul"]


def _constant_ints(value: Any) -> list[int] | None:
    """The int64 contents of an initializer or ``Constant`` output, else None."""
    from onnx_ir.convenience import get_const_tensor

    if value is None:
        return None
    try:
        tensor = get_const_tensor(value)
        return None if tensor is None else [int(i) for i in np.asarray(tensor.numpy()).reshape(-1)]
    except Exception:  # a malformed Constant: not a sum this rewrite knows
        return None


def _leading_split(node: Any) -> tuple[int, int, int] | None:
    """``(k, M, N)`` when ``node`` is a float32/float64 ``ReduceSum`` over exactly the first
    ``k`` of its static input's axes (``0 < k < rank``): ``M`` elements summed per output one,
    ``N`` outputs; else None."""
    import onnx_ir as ir

    if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    x = node.inputs[0]
    if x is None or x.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE) or x.shape is None:
        return None
    dims = list(x.shape)
    if not dims or not all(isinstance(d, int) for d in dims):
        return None
    axes = _constant_ints(node.inputs[1])
    if not axes:
        return None
    rank = len(dims)
    reduced = sorted({a % rank for a in axes})
    k = len(reduced)
    if reduced != list(range(k)) or k >= rank:
        return None
    m, n = math.prod(dims[:k]), math.prod(dims[k:])
    if m < 2 or n < 1:
        return None
    return k, m, n


def leading_sums_as_matmul(model: Any, providers: Sequence[str] | None) -> int:
    """Rewrite the top-level graph's sums over leading axes (see the module docstring), in place,
    when ``providers`` run the graph on the CPU provider; returns how many were rewritten."""
    if not providers or providers[0] != "CPUExecutionProvider":
        return 0
    import onnx_ir as ir

    graph = model.graph
    rewritten = 0
    for node in list(graph):
        split = _leading_split(node)
        if split is None:
            continue
        k, m, n = split
        x, out = node.inputs[0], node.outputs[0]
        dims = list(x.shape)
        keepdims = node.attributes.get("keepdims")
        keep = int(keepdims.value) if keepdims is not None else 1
        out_dims = [1] * k + dims[k:] if keep else dims[k:]
        base = node.name or "sum"

        def const(values: list[int], name: str) -> Any:
            tensor = ir.tensor(np.array(values, dtype=np.int64), name=name)
            value = ir.Value(name=name, const_value=tensor, shape=ir.Shape([len(values)]), type=ir.TensorType(ir.DataType.INT64))
            graph.register_initializer(value)
            return value

        matrix = ir.Node("", "Reshape", [x, const([m, n], f"{base}_rows_shape")], name=f"{base}_rows", num_outputs=1)
        ones = ir.Node(
            "", "ConstantOfShape", [const([1, m], f"{base}_ones_shape")],
            attributes=[ir.AttrTensor("value", ir.tensor(np.ones(1, dtype=x.dtype.numpy())))],
            name=f"{base}_ones", num_outputs=1,
        )
        product = ir.Node("", "MatMul", [ones.outputs[0], matrix.outputs[0]], name=f"{base}_matmul", num_outputs=1)
        reshaped = ir.Node("", "Reshape", [product.outputs[0], const(out_dims, f"{base}_out_shape")], name=f"{base}_out", num_outputs=1)
        for made, shape in ((matrix, [m, n]), (ones, [1, m]), (product, [1, n]), (reshaped, out_dims)):
            made.outputs[0].dtype = x.dtype
            made.outputs[0].shape = ir.Shape(shape)
        graph.insert_before(node, [matrix, ones, product, reshaped])
        result = reshaped.outputs[0]
        take_output_name(graph, out, result, "_reduced")
        out.replace_all_uses_with(result)
        graph.remove(node, safe=True)
        rewritten += 1
    return rewritten

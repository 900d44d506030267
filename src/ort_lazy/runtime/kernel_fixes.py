"""Models rewritten around the version-keyed kernel bugs (:mod:`~ort_lazy.runtime.known_bugs`) of
the installed onnxruntime and the providers that run them (:func:`kernel_fixes`): ceil-mode
pooling cut to ONNX's shape, AveragePool's padded divisor made right, OpenVINO's ReduceMax of
only ``-inf`` given ``-inf``. Every value added is typed, for readers that need every value
typed (OpenVINO's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .known_bugs import (
    _CPU,
    _FIXED_BY_REWRITE,
    AVERAGE_POOL_PADDED_DIVISOR,
    OPENVINO_REDUCE_MAX_LOWEST,
    POOL_CEIL_EXTRA_WINDOW,
    KnownBug,
    has_bug,
)
from .onnx_graphs import _graphs, _types_and_shapes

__all__ = ["KERNEL_FIXES_FACT", "kernel_fixes"]

#: :attr:`~ort_lazy.specs.OrtModel.facts` entry of a model :func:`kernel_fixes` has seen already
#: (at export), so opening a session need not parse it again
KERNEL_FIXES_FACT = "kernel_fixes"


def kernel_fixes(model_bytes: bytes, providers: Sequence[str] = (_CPU,), version: tuple[int, int] | None = None) -> bytes:
    """``model_bytes`` rewritten around the kernel bugs a session on ``providers`` of onnxruntime
    ``version`` (default: the installed one) meets (:data:`POOL_CEIL_EXTRA_WINDOW`,
    :data:`AVERAGE_POOL_PADDED_DIVISOR`, :data:`OPENVINO_REDUCE_MAX_LOWEST`); the same bytes
    when it meets none or the model has no node concerned.

    Raises:
        ValueError: a pooling that needs the rewrite has an input of unknown spatial shape (the
            region then runs in PyTorch: ORT's result would be wrong).
    """
    bugs = [bug for bug in _FIXED_BY_REWRITE if has_bug(bug, providers, version)]
    pools = any(b in bugs for b in (POOL_CEIL_EXTRA_WINDOW, AVERAGE_POOL_PADDED_DIVISOR)) and b"Pool" in model_bytes
    maxima = OPENVINO_REDUCE_MAX_LOWEST in bugs and b"ReduceMax" in model_bytes
    if not (pools or maxima):
        return model_bytes
    import onnx

    proto = onnx.load_from_string(model_bytes)
    graphs = _graphs(proto.graph)
    types, shapes = _types_and_shapes(proto, infer=False)
    concerned = [
        name
        for g in graphs
        for n in g.node
        if n.op_type in ("MaxPool", "AveragePool", "ReduceMax") and n.domain in ("", "ai.onnx")
        for name in n.input[:1]
    ]
    if any(name not in types or None in shapes.get(name, (None,)) for name in concerned):
        # inference from the inputs alone: a translator's recorded shape may have unknown dims
        bare = onnx.ModelProto()
        bare.CopyFrom(proto)
        for g in _graphs(bare.graph):
            del g.value_info[:]
        inferred_types, inferred_shapes = _types_and_shapes(bare)
        types = {**inferred_types, **types}
        for name, dims in inferred_shapes.items():
            if None in shapes.get(name, (None,)) and None not in dims:
                shapes[name] = dims
    counter = [0]
    changed = 0
    for graph in graphs:
        changed += _fix_kernels(graph, bugs, types, shapes, counter)
    return proto.SerializeToString() if changed else model_bytes


def _fix_kernels(
    graph: Any, bugs: list[KnownBug], types: dict[str, int], shapes: dict[str, tuple[int | None, ...]], counter: list[int]
) -> int:
    """Rewrite the nodes of ``graph`` (not its subgraphs) concerned by ``bugs``; the number rewritten."""
    nodes: list[Any] = []
    changed = 0
    for node in graph.node:
        nodes.append(node)
        if node.domain not in ("", "ai.onnx"):
            continue
        extra: list[Any] = []
        if node.op_type in ("MaxPool", "AveragePool"):
            extra = _fix_pool(graph, node, bugs, types, shapes, counter)
        elif node.op_type == "ReduceMax" and OPENVINO_REDUCE_MAX_LOWEST in bugs:
            extra = _fix_reduce_max(graph, node, types, shapes, counter)
        if extra:
            nodes += extra
            changed += 1
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
    return changed


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _typed(graph: Any, name: str, elem: int | None, dims: Sequence[int | None] | None) -> None:
    """Record ``name``'s type (and shape, None dims unknown) in ``graph.value_info``: readers that
    need every value typed (OpenVINO's) get the new values typed too."""
    from onnx import helper

    if elem:
        graph.value_info.append(helper.make_tensor_value_info(name, elem, None if dims is None else list(dims)))


def _fix_pool(
    graph: Any, node: Any, bugs: list[KnownBug], types: dict[str, int], shapes: dict[str, tuple[int | None, ...]], counter: list[int]
) -> list[Any]:
    """The nodes that follow a pooling ``node`` to give ONNX's (and PyTorch's) result, ``node``
    changed in place to feed them; empty when nothing is needed."""
    from onnx import helper

    attrs = _attributes(node)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET":
        return []  # ort-lazy's translations give explicit pads
    kernel = list(attrs["kernel_shape"])
    rank = len(kernel)
    strides = list(attrs.get("strides", [1] * rank))
    pads = list(attrs.get("pads", [0] * 2 * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    ceil = bool(attrs.get("ceil_mode", 0))
    counted = node.op_type == "AveragePool" and bool(attrs.get("count_include_pad", 0))
    divisor = counted and AVERAGE_POOL_PADDED_DIVISOR in bugs and (any(pads) or ceil) and set(dilations) == {1}
    cut = ceil and POOL_CEIL_EXTRA_WINDOW in bugs
    if not (divisor or cut):
        return []
    shape = shapes.get(node.input[0])
    spatial = list(shape[2:]) if shape is not None and len(shape) == rank + 2 else None
    if spatial is None or not all(isinstance(d, int) for d in spatial):
        raise ValueError(f"{node.op_type} {node.name!r}: its input's spatial shape is unknown, and this onnxruntime's kernel needs it")
    sizes, extra_window = [], False
    for i, n in enumerate(spatial):
        span = n + pads[i] + pads[rank + i] - dilations[i] * (kernel[i] - 1) - 1
        out = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if ceil and (out - 1) * strides[i] >= n + pads[i]:
            out -= 1  # the last window would start past the input and its leading padding
            extra_window = True
        sizes.append(out)
    cut = cut and extra_window
    if not (divisor or cut):
        return []
    counter[0] += 1
    stem = f"_kernel_fix{counter[0]}"
    outputs = [o for o in node.output]
    elem = types.get(node.input[0])
    extra: list[Any] = []
    if cut:
        starts = helper.make_tensor(f"{stem}_starts", 7, [rank], [0] * rank)
        ends = helper.make_tensor(f"{stem}_ends", 7, [rank], sizes)
        axes = helper.make_tensor(f"{stem}_axes", 7, [rank], list(range(2, rank + 2)))
        extra += [
            helper.make_node("Constant", [], [f"{stem}_starts"], value=starts),
            helper.make_node("Constant", [], [f"{stem}_ends"], value=ends),
            helper.make_node("Constant", [], [f"{stem}_axes"], value=axes),
        ]
        for constant in ("starts", "ends", "axes"):
            _typed(graph, f"{stem}_{constant}", 7, [rank])
        for i, name in enumerate(outputs):
            if not name:
                continue
            pooled = f"{stem}_pooled{i}"
            node.output[i] = pooled
            _typed(graph, pooled, elem if i == 0 else 7, [shape[0], shape[1], *([None] * rank)])
            extra.append(helper.make_node("Slice", [pooled, f"{stem}_starts", f"{stem}_ends", f"{stem}_axes"], [name]))
    if divisor:
        import numpy as np

        ratio = np.ones(sizes, dtype=np.float64)
        for i, (n, out) in enumerate(zip(spatial, sizes)):
            start = np.arange(out) * strides[i] - pads[i]
            end = np.minimum(start + kernel[i], n + pads[rank + i])
            inside = np.minimum(end, n) - np.maximum(start, 0)
            ratio = ratio * (inside / (end - start)).reshape([out if j == i else 1 for j in range(rank)])
        if elem not in (1, 10, 11, 16):  # float, float16, double, bfloat16
            raise ValueError(f"AveragePool {node.name!r}: an input of element type {elem} cannot be rescaled")
        for a in node.attribute:
            if a.name == "count_include_pad":
                a.i = 0
        averaged = extra[-1] if cut else node
        unscaled = f"{stem}_average"
        result = averaged.output[0] if cut else outputs[0]
        averaged.output[0] = unscaled
        _typed(graph, unscaled, elem, [shape[0], shape[1], *sizes])
        scale = helper.make_tensor(f"{stem}_ratio", elem, sizes, ratio.ravel().tolist())
        _typed(graph, f"{stem}_ratio", elem, sizes)
        extra += [
            helper.make_node("Constant", [], [f"{stem}_ratio"], value=scale),
            helper.make_node("Mul", [unscaled, f"{stem}_ratio"], [result]),
        ]
    return extra


def _fix_reduce_max(
    graph: Any, node: Any, types: dict[str, int], shapes: dict[str, tuple[int | None, ...]], counter: list[int]
) -> list[Any]:
    """For a float32 ``ReduceMax`` ``node`` (see :data:`OPENVINO_REDUCE_MAX_LOWEST`), the nodes
    that put ``-inf`` where every reduced element is ``-inf`` (a second ``ReduceMax``, of the 0/1
    mask of the other elements, tells); ``node`` is changed in place to feed them. Empty when it
    stays as it is."""
    from onnx import helper

    x = node.input[0]
    if types.get(x) != 1:
        return []
    counter[0] += 1
    stem = f"_kernel_fix{counter[0]}"
    y = node.output[0]
    out_shape = shapes.get(y)
    node.output[0] = f"{stem}_max"
    for name, elem, dims in (
        (f"{stem}_ninf", 1, ()), (f"{stem}_finite_not", 9, shapes.get(x)), (f"{stem}_finite", 9, shapes.get(x)),
        (f"{stem}_mask", 1, shapes.get(x)), (f"{stem}_max", 1, out_shape), (f"{stem}_any", 1, out_shape),
        (f"{stem}_some", 9, out_shape),
    ):  # fmt: skip
        _typed(graph, name, elem, dims)
    lowest = helper.make_tensor(f"{stem}_ninf", 1, [], [float("-inf")])
    any_left = helper.make_node("ReduceMax", [f"{stem}_mask", *node.input[1:]], [f"{stem}_any"])
    any_left.attribute.extend(node.attribute)
    return [
        helper.make_node("Constant", [], [f"{stem}_ninf"], value=lowest),
        helper.make_node("Equal", [x, f"{stem}_ninf"], [f"{stem}_finite_not"]),
        helper.make_node("Not", [f"{stem}_finite_not"], [f"{stem}_finite"]),
        helper.make_node("Cast", [f"{stem}_finite"], [f"{stem}_mask"], to=1),
        any_left,
        helper.make_node("Cast", [f"{stem}_any"], [f"{stem}_some"], to=9),
        helper.make_node("Where", [f"{stem}_some", f"{stem}_max", f"{stem}_ninf"], [y]),
    ]

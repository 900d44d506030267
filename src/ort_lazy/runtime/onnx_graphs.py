"""Walking ONNX models for the rewrites of :mod:`~ort_lazy.runtime.quirks` and
:mod:`~ort_lazy.runtime.kernel_fixes`: the graphs nodes hold (``If`` branches, ``Loop`` bodies),
each value's element type and shape, and how often each name is read.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def _subgraphs(node: Any) -> list[Any]:
    """The graphs ``node`` holds in its attributes (If's branches, Loop's body)."""
    return [g for attr in node.attribute for g in ((attr.g,) if attr.HasField("g") else attr.graphs)]


def _value_types(proto: Any) -> dict[str, int]:
    """ONNX element type of each value of ``proto``'s graphs that inference can tell."""
    return _types_and_shapes(proto)[0]


def _types_and_shapes(proto: Any, infer: bool = True) -> tuple[dict[str, int], dict[str, tuple[int | None, ...]]]:
    """ONNX element type and shape (None for a dim it cannot tell) of each value of ``proto``'s
    graphs that inference can tell (``infer=False``: that the model itself records)."""
    import onnx

    if infer:
        try:
            proto = onnx.shape_inference.infer_shapes(proto)
        except Exception:  # untyped values are left alone by the rewrites
            pass
    types: dict[str, int] = {}
    shapes: dict[str, tuple[int | None, ...]] = {}

    def collect(graph: Any) -> None:
        for init in graph.initializer:
            types[init.name] = init.data_type
            shapes[init.name] = tuple(init.dims)
        for value in (*graph.input, *graph.value_info, *graph.output):
            ttype = value.type.tensor_type
            if ttype.elem_type:
                types[value.name] = ttype.elem_type
            if ttype.HasField("shape"):
                shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim)
        for node in graph.node:
            for sub in _subgraphs(node):
                collect(sub)

    collect(proto.graph)
    return types, shapes


def _graphs(graph: Any) -> list[Any]:
    """``graph`` and the graphs its nodes hold, depth first."""
    found = [graph]
    for node in graph.node:
        for sub in _subgraphs(node):
            found += _graphs(sub)
    return found


def _uses(graph: Any) -> dict[str, int]:
    """How often each name is read in ``graph``: node inputs (those of subgraphs too) and outputs."""
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
        for sub in _subgraphs(node):
            for name, count in _uses(sub).items():
                uses[name] = uses.get(name, 0) + count
    for out in graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    return uses

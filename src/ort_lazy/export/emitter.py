"""Writing ONNX nodes by hand inside the exporter's translator (ort-lazy's own translations),
and editing the graphs it makes."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _compat

__all__ = ["Emitter", "translation_emitter", "take_output_name", "cast_node"]

_names = itertools.count()


class Emitter:
    """Appends ONNX nodes to a list, naming every value it creates."""

    def __init__(self, nodes: list[Any], prefix: str, version: int | None) -> None:
        self.nodes = nodes
        self.prefix = prefix
        self.version = version
        self._count = itertools.count()

    def name(self) -> str:
        """A fresh value name."""
        return f"{self.prefix}_{next(self._count)}"

    def op(self, op_type: str, *inputs: Any, num_outputs: int = 1, domain: str = "", **attributes: Any) -> Any:
        """The output (outputs, with ``num_outputs`` > 1) of a new ``op_type`` node (of the
        ONNX domain unless ``domain`` names another, e.g. ORT's ``com.microsoft``)."""
        import onnx_ir as ir

        attrs = [a for a in ir.convenience.convert_attributes(attributes) if a.value is not None]
        version = self.version if not domain else 1
        node = ir.Node(domain, op_type, list(inputs), attrs, num_outputs=num_outputs, version=version)
        node.name = f"node_{self.name()}"
        for out in node.outputs:
            out.name = self.name()
        self.nodes.append(node)
        return node.outputs[0] if num_outputs == 1 else node.outputs

    def const(self, value: Any, dtype: Any) -> Any:
        """A 0-d constant of ONNX type ``dtype`` holding ``value``."""
        import onnx_ir as ir

        array = np.array(value, dtype=ir.DataType(dtype).numpy())
        return self.op("Constant", value=ir.tensor(array))

    def branch(
        self,
        condition: Any,
        then: Callable[[Emitter], Sequence[Any]],
        otherwise: Callable[[Emitter], Sequence[Any]],
    ) -> list[Any]:
        """The outputs of an ONNX ``If`` on ``condition``: ``then`` and ``otherwise`` each add
        their branch's nodes through the emitter they are given and return its outputs (values
        of either scope), as many and of the same types."""
        import onnx_ir as ir

        graphs = []
        for label, build in (("then", then), ("else", otherwise)):
            nodes: list[Any] = []
            sub = Emitter(nodes, f"{self.name()}_{label}", None)
            outputs = [sub.op("Identity", v) for v in build(sub)]  # a branch's outputs are its own
            graphs.append(ir.Graph([], outputs, nodes=nodes, name=sub.prefix))
        count = len(graphs[0].outputs)
        out = self.op("If", condition, num_outputs=count, then_branch=graphs[0], else_branch=graphs[1])
        return [out] if count == 1 else list(out)

    def cast(self, value: Any, dtype: Any) -> Any:
        """``value`` as ONNX type ``dtype`` (itself when it already is)."""
        return value if value.dtype == dtype else self.op("Cast", value, to=dtype)


def translation_emitter(name: str) -> Emitter:
    """An emitter adding nodes to the translation the exporter is running, its value names
    prefixed by ``name`` and a number unique in the process.

    Raises:
        RuntimeError: no translation is running (ort-lazy's translations are called by the
            exporter's translator, never directly).
    """
    tracer = _compat.current_translation_tracer()
    if tracer is None:
        raise RuntimeError("ort-lazy's translations run inside the exporter's translator")
    return Emitter(tracer.nodes, f"{name}_{next(_names)}", tracer.opset.version)


def take_output_name(graph: Any, old: Any, new: Any, suffix: str) -> bool:
    """Where ``old`` is an output of ``graph`` (``onnx_ir``), put ``new`` in its place under
    ``old``'s name (``old`` is renamed with ``suffix``), so the model's output names stay those
    its caller binds; returns whether it was an output."""
    outputs = list(graph.outputs)
    if not any(value is old for value in outputs):
        return False
    name = old.name
    old.name = f"{name}{suffix}"
    new.name = name
    for i, value in enumerate(outputs):
        if value is old:
            graph.outputs[i] = new
    return True


def cast_node(value: Any, to: Any, name: str) -> Any:
    """A ``Cast`` of ``value`` (``onnx_ir``) to the data type ``to``, its output typed and shaped
    (not yet in a graph)."""
    import onnx_ir as ir

    node = ir.Node("", "Cast", [value], attributes=[ir.AttrInt64("to", int(to))], num_outputs=1, name=name)
    out = node.outputs[0]
    out.dtype = to
    out.shape = value.shape
    return node

"""What every stage says about a compiled model: tensor specs and the exported model.

:class:`TensorSpec` describes one graph input or output on the torch side (dtype, shape with
symbolic dims as names, device); :class:`OrtModel` is a serialized ONNX model with the specs of
its inputs and outputs. Export produces them, the runtime binds by them, the disk cache and
dumps write them as JSON (:func:`spec_to_json`).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "TensorSpec",
    "OrtModel",
    "TORCH_TO_ONNX",
    "spec_to_json",
    "spec_from_json",
    "WEIGHT_MODES",
    "parse_dim",
    "dim_symbols",
]

#: How a region binds the parameters it does not take as graph inputs:
#: ``snapshot``: their values baked into the model at compile time (``freeze_weights``);
#: ``shared``: ORT initializers on the parameters' own memory (ORT prepacks them), the session
#: rebuilt when a parameter changes (in place or replaced);
#: ``copied``: their values baked into the model (which a precision change such as int8
#: quantization needs), the model rebuilt when a parameter changes.
WEIGHT_MODES = ("snapshot", "shared", "copied")

#: torch dtype -> ONNX TensorProto element type
TORCH_TO_ONNX: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.uint8: 2,
    torch.int8: 3,
    torch.int16: 5,
    torch.int32: 6,
    torch.int64: 7,
    torch.bool: 9,
    torch.float16: 10,
    torch.float64: 11,
    torch.complex64: 14,
    torch.complex128: 15,
    torch.bfloat16: 16,
}


@dataclass(frozen=True)
class TensorSpec:
    """dtype, shape (ints, or names for symbolic dims) and device of one graph input/output.

    ``scalar`` marks a Python number (SymInt/SymFloat/SymBool) bound as a 0-d tensor.
    """

    dtype: torch.dtype
    shape: tuple[int | str, ...]
    device: torch.device
    scalar: bool = False

    @property
    def static(self) -> bool:
        """Whether every dim is a concrete int."""
        return all(isinstance(d, int) for d in self.shape)


def spec_to_json(spec: TensorSpec, name: str | None = None) -> dict[str, Any]:
    """A JSON-friendly form of ``spec`` (see :func:`spec_from_json`), with ``name`` if given."""
    out: dict[str, Any] = {} if name is None else {"name": name}
    out.update(
        dtype=str(spec.dtype).replace("torch.", ""),
        shape=list(spec.shape),
        device=str(spec.device),
        scalar=spec.scalar,
    )
    return out


def spec_from_json(data: dict[str, Any]) -> TensorSpec:
    """Inverse of :func:`spec_to_json`; rejects unknown dtypes (no arbitrary lookups)."""
    dtype = getattr(torch, str(data["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {data['dtype']!r}")
    shape = tuple(d if isinstance(d, int) else str(d) for d in data["shape"])
    return TensorSpec(dtype, shape, torch.device(str(data["device"])), bool(data.get("scalar", False)))


@dataclass
class OrtModel:
    """A serialized ONNX model with the torch-side description of its inputs and outputs."""

    model_bytes: bytes
    input_names: list[str]
    output_names: list[str]
    input_specs: list[TensorSpec]
    output_specs: list[TensorSpec]
    name: str = "region"
    #: initializers whose data the session gets from torch tensors: name -> graph position
    external: dict[str, int] = dataclasses.field(default_factory=dict)
    #: what analyses of the model's bytes found, by name (JSON values, see :meth:`fact`); kept
    #: with the model in the compile cache, so a warm process need not parse the model (nor
    #: import ``onnx``) to open a session for it
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: how many of the last outputs are checks: boolean flags (0-d) that, when one is set,
    #: say this call's inputs need PyTorch (the model took a fast form that is wrong for them,
    #: e.g. max pooling without eager's NaN rule); not among the values a runner returns
    checks: int = 0

    def __post_init__(self) -> None:
        self.digest = hashlib.sha256(self.model_bytes).hexdigest()

    def fact(self, name: str, analysis: Callable[[bytes], Any]) -> Any:
        """``analysis(model_bytes)``, computed once per model and remembered as ``name``."""
        if name not in self.facts:
            self.facts[name] = analysis(self.model_bytes)
        return self.facts[name]

    def describe(self) -> dict[str, Any]:
        """Names and specs of inputs and outputs, and the facts known so far (JSON-friendly)."""
        return {
            "inputs": [spec_to_json(s, n) for n, s in zip(self.input_names, self.input_specs)],
            "outputs": [spec_to_json(s, n) for n, s in zip(self.output_names, self.output_specs)],
            "external": dict(self.external),
            "facts": dict(self.facts),
            "checks": self.checks,
        }

    @classmethod
    def from_description(cls, model_bytes: bytes, data: dict[str, Any], name: str) -> OrtModel:
        """Inverse of :meth:`describe` (with the model bytes)."""
        return cls(
            model_bytes=model_bytes,
            input_names=[d["name"] for d in data["inputs"]],
            output_names=[d["name"] for d in data["outputs"]],
            input_specs=[spec_from_json(d) for d in data["inputs"]],
            output_specs=[spec_from_json(d) for d in data["outputs"]],
            name=name,
            external={str(k): int(v) for k, v in data.get("external", {}).items()},
            facts=dict(data.get("facts", {})),
            checks=int(data.get("checks", 0)),
        )


# -- symbolic dims ----------------------------------------------------------------------------------

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _fold(fn: Callable[[Any, Any], Any], values: Sequence[Any]) -> Any:
    result = values[0]
    for v in values[1:]:
        result = fn(result, v)
    return result


_CALLS: dict[str, Callable[..., Any]] = {
    "Max": lambda *a: _fold(torch.sym_max, a),
    "Min": lambda *a: _fold(torch.sym_min, a),
    "FloorDiv": operator.floordiv,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
}


def parse_dim(expr: str) -> Callable[[Mapping[str, Any]], Any]:
    """A function computing a symbolic dim's expression as :class:`TensorSpec` writes it
    (``s0``, ``2*s0``, ``(s0//2)``, ``Max(1, s0)``) from the values of its symbols (ints, or
    SymInts while tracing). Only integer arithmetic is read (+, -, *, //, %, Max, Min,
    FloorDiv, Mod): never ``eval``.

    Raises:
        ValueError: ``expr`` has anything else. The function raises :class:`KeyError` for a
            symbol it is not given.
    """

    def build(node: ast.AST) -> Callable[[Mapping[str, Any]], Any]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
            return lambda symbols: value
        if isinstance(node, ast.Name) and node.id not in _CALLS:
            name = node.id
            return lambda symbols: symbols[name]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            fn, left, right = _BINARY[type(node.op)], build(node.left), build(node.right)
            return lambda symbols: fn(left(symbols), right(symbols))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = build(node.operand)
            return lambda symbols: -inner(symbols)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS and node.args and not node.keywords:
            call, parts = _CALLS[node.func.id], [build(a) for a in node.args]
            return lambda symbols: call(*(p(symbols) for p in parts))
        raise ValueError(f"dim {expr!r}: unsupported expression {ast.dump(node)[:80]}")

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"dim {expr!r} is not an expression: {e}") from None
    return build(tree.body)


def dim_symbols(expr: str) -> set[str]:
    """The symbols a symbolic dim's expression reads (see :func:`parse_dim`). Raises
    :class:`ValueError` for text that is no expression."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"dim {expr!r} is not an expression: {e}") from None
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _CALLS}

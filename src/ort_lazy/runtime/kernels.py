"""ORT's kernel registry: which ONNX op runs for which dtypes on which execution provider.

Used by the support table to reject, before any session is created, a region that ORT would
refuse (e.g. bfloat16 ``Mul`` on CPU) so that it falls back to PyTorch up front.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import metrics
from ._ort import KernelDefsUnavailableError, kernel_defs
from .quirks import missing_at_run_time

__all__ = [
    "KernelRegistry",
    "kernel_registry",
    "UnsupportedNode",
    "unsupported_nodes",
    "session_refusal",
    "node_bindings",
    "node_opset",
    "type_str",
]

_MAX = 2**31 - 1
# ORT's CPU provider inserts Cast nodes around float16 ops that only have float kernels
# (InsertCastTransformer); it does nothing of the sort for bfloat16.
_CPU_CASTABLE = {"tensor(float16)": "tensor(float)"}


@dataclass(frozen=True)
class UnsupportedNode:
    """An ONNX node no requested provider has a kernel for."""

    op_type: str
    domain: str
    types: tuple[str, ...]
    node_name: str

    def describe(self) -> str:
        """``Mul(tensor(bfloat16))``-like text."""
        return f"{self.op_type}({', '.join(t for t in self.types if t)})"


class KernelRegistry:
    """Kernel definitions by (domain, op type, provider)."""

    def __init__(self, defs: Iterable[object], complete: bool = True) -> None:
        #: False when onnxruntime's kernel list could not be read: nothing is known, and
        #: whether ORT runs a graph is learnt by creating a session for it
        self.complete = complete
        self._defs: dict[tuple[str, str, str], list[tuple[int, int, dict[str, set[str]]]]] = {}
        for d in defs:
            domain = _norm_domain(d.domain)  # type: ignore[attr-defined]
            key = (domain, d.op_name, d.provider)  # type: ignore[attr-defined]
            lo, hi = d.version_range  # type: ignore[attr-defined]
            constraints = {k: set(v) for k, v in d.type_constraints.items()}  # type: ignore[attr-defined]
            self._defs.setdefault(key, []).append((lo, hi, constraints))
        self._ops = {(dom, op) for dom, op, _ in self._defs}

    def knows(self, domain: str, op_type: str) -> bool:
        """Whether any provider registers ``op_type`` at all."""
        return (_norm_domain(domain), op_type) in self._ops

    def has_kernel(
        self,
        domain: str,
        op_type: str,
        opset: int,
        providers: Sequence[str],
        bindings: dict[str, str],
        exact: bool = False,
    ) -> bool:
        """Whether a kernel exists on any of ``providers`` for the type ``bindings``.

        ``bindings`` maps type-constraint names (``T``) to ONNX type strings
        (``tensor(float)``); constraints the kernel leaves open are not checked. Unless
        ``exact``, a float16 node the CPU provider runs through its own inserted casts counts.
        """
        domain = _norm_domain(domain)
        for provider in providers:
            for lo, hi, constraints in self._defs.get((domain, op_type, provider), ()):
                if not lo <= opset <= min(hi, _MAX):
                    continue
                if _matches(constraints, bindings):
                    return True
                if provider == "CPUExecutionProvider" and not exact:
                    cast = {k: _CPU_CASTABLE.get(v, v) for k, v in bindings.items()}
                    if cast != bindings and _matches(constraints, cast):
                        return True
        return False


def _matches(constraints: dict[str, set[str]], bindings: dict[str, str]) -> bool:
    return all(
        name not in constraints or type_str in constraints[name]
        for name, type_str in bindings.items()
    )


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@functools.lru_cache(maxsize=1)
def kernel_registry() -> KernelRegistry:
    """The installed onnxruntime's kernel registry (read once).

    When onnxruntime cannot list its kernels (see :func:`~._ort.kernel_defs`), the registry is
    empty and marked incomplete: the support table then asks ORT itself, by creating a session
    for each probe graph (see :func:`session_refusal`), with one warning.
    """
    try:
        return KernelRegistry(kernel_defs())
    except KernelDefsUnavailableError as e:
        metrics.warn_once(
            "kernel_defs",
            "ort-lazy: onnxruntime's kernel list could not be read (%s); which ops ORT runs is learnt "
            "by creating a session for the ops probed",
            e,
        )
        return KernelRegistry((), complete=False)


def session_refusal(model_bytes: bytes, providers: Sequence[str]) -> str | None:
    """ORT's error creating a session for ``model_bytes`` on ``providers`` (first line), or None
    when it loads: the kernel check when the registry is incomplete. No graph optimization runs:
    only whether every node finds a kernel is asked, of ORT's kernel providers among
    ``providers`` (a compiling provider such as OpenVINO leaves what it refuses to them, and
    would compile every probe)."""
    from .flavour import onnxruntime
    from .providers import kernel_providers
    from .session_create import _clamp_ir_version

    ort = onnxruntime()
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(_clamp_ir_version(model_bytes), sess_options=so, providers=kernel_providers(providers))
    except Exception as e:
        text = str(e).strip().splitlines()
        return (text[0] if text else type(e).__name__)[:200]
    return None


@functools.lru_cache(maxsize=4096)
def _schema_io(op_type: str, opset: int, domain: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Type-constraint names of a schema's inputs and outputs."""
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return (), ()
    ins = tuple(i.type_str for i in schema.inputs)
    outs = tuple(o.type_str for o in schema.outputs)
    return ins, outs


def type_str(value: object) -> str | None:
    """``tensor(float)``-like type of an ``onnx_ir`` value, None when unknown."""
    if value is None or value.dtype is None:  # type: ignore[attr-defined]
        return None
    return f"tensor({_ONNX_TYPE_NAMES.get(value.dtype, str(value.dtype).lower())})"  # type: ignore[attr-defined]


def node_opset(node: object, opsets: dict[str, int]) -> tuple[str, int]:
    """(normalized domain, opset version) an ``onnx_ir`` node runs at under ``opsets``."""
    domain = _norm_domain(node.domain)  # type: ignore[attr-defined]
    if domain == "":
        return domain, opsets.get("", opsets.get("ai.onnx", 1))
    return domain, opsets.get(domain, 1)


def node_bindings(node: object, domain: str, opset: int) -> dict[str, str]:
    """The node's type-constraint bindings (``{"T": "tensor(float)"}``) from its values' types."""
    ins, outs = _schema_io(node.op_type, opset, domain)  # type: ignore[attr-defined]
    bindings: dict[str, str] = {}
    for formal, value in list(zip(ins, node.inputs)) + list(zip(outs, node.outputs)):  # type: ignore[attr-defined]
        ts = type_str(value)
        if ts is not None and formal and not formal.startswith("tensor"):
            bindings.setdefault(formal, ts)
    return bindings


def unsupported_nodes(model: object, providers: Sequence[str]) -> list[UnsupportedNode]:
    """ONNX nodes of an ``onnx_ir`` model with no kernel on ``providers`` for their dtypes.

    Nodes in local function domains are walked through their function bodies. Ops the schema
    defines as functions (ORT expands them) and ops outside ORT's registry with no schema are
    left to session creation to decide.
    """
    registry = kernel_registry()
    opsets = dict(model.opset_imports)  # type: ignore[attr-defined]
    local = {f.identifier(): f for f in model.functions.values()}  # type: ignore[attr-defined]
    bad: list[UnsupportedNode] = []

    def visit(nodes: Iterable[object], opsets: dict[str, int]) -> None:
        for node in nodes:
            key = (node.domain, node.op_type, node.overload)  # type: ignore[attr-defined]
            if key in local:
                fn = local[key]
                visit(fn, {**opsets, **dict(fn.opset_imports)})
                continue
            domain, opset = node_opset(node, opsets)
            if not registry.knows(domain, node.op_type):  # type: ignore[attr-defined]
                continue  # function-expanded or unknown: session creation decides
            bindings = node_bindings(node, domain, opset)
            refused = all(missing_at_run_time(node, p) for p in providers)
            if refused or not registry.has_kernel(domain, node.op_type, opset, providers, bindings):  # type: ignore[attr-defined]
                bad.append(
                    UnsupportedNode(
                        node.op_type,  # type: ignore[attr-defined]
                        domain,
                        tuple(sorted(set(bindings.values()))),
                        node.name or "",  # type: ignore[attr-defined]
                    )
                )

    visit(model.graph, opsets)  # type: ignore[attr-defined]
    return bad


def _onnx_type_names() -> dict[object, str]:
    import onnx_ir as ir

    d = ir.DataType
    return {
        d.FLOAT: "float",
        d.DOUBLE: "double",
        d.FLOAT16: "float16",
        d.BFLOAT16: "bfloat16",
        d.INT64: "int64",
        d.INT32: "int32",
        d.INT16: "int16",
        d.INT8: "int8",
        d.UINT8: "uint8",
        d.UINT16: "uint16",
        d.UINT32: "uint32",
        d.UINT64: "uint64",
        d.BOOL: "bool",
        d.STRING: "string",
        d.COMPLEX64: "complex64",
        d.COMPLEX128: "complex128",
    }


_ONNX_TYPE_NAMES = _onnx_type_names()

"""Translation probes: one op translated alone, every ONNX node it emits checked against ORT.

An op is supported when the exporter has an ONNX translation for its overload AND every ONNX
node that translation emits for the op's actual dtypes has a kernel on the chosen providers
(ORT's kernel registry). :func:`probe_op` finds out by translating the single op; answers are
memoised per signature (overload, dtypes, ranks, emptiness, constant arguments, providers) in a
table per compile cache directory, in memory and, with a cache directory, on disk for later
processes (:func:`save_support_table`). The TorchScript probes (:mod:`.torchscript`) keep their
answers in the same tables.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ..reasons import Reason
from .rules import _meta

__all__ = ["probe_error", "probe_op", "probe_ops", "save_support_table"]


_probe_lock = threading.Lock()
_probe_errors: dict[str, str] = {}


def probe_error(target: Any) -> str | None:
    """The last error translating ``target`` alone raised in this process (why it is "export failed")."""
    with _probe_lock:
        return _probe_errors.get(str(target))


def _probe_key(node: torch.fx.Node, providers: tuple[str, ...]) -> tuple[Any, ...]:
    def sig(v: Any) -> Any:
        m = _meta(v) if isinstance(v, torch.fx.Node) else v
        if isinstance(m, torch.Tensor):
            # Zero-size tensors translate differently (torchlib drops them from a Concat, which
            # then has no input): an answer learnt on one must not stand for non-empty ones.
            return ("T", m.dtype, m.dim(), any(type(s) is int and s == 0 for s in m.shape))
        if isinstance(m, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return ("S", type(m).__name__)
        if isinstance(m, (list, tuple)):
            return tuple(sig(x) for x in m)
        if isinstance(m, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(m)
        try:
            hash(m)
        except TypeError:
            return repr(m)
        return m

    args = tuple(sig(a) for a in node.args)
    kwargs = tuple(sorted((k, sig(v)) for k, v in node.kwargs.items()))
    out = sig(node)
    return (node.target, args, kwargs, out, providers)


def probe_op(node: torch.fx.Node, providers: tuple[str, ...], cache_dir: str | None = None) -> str | None:
    """Translate ``node`` alone and check every emitted ONNX node against ORT's kernels.

    Answers are memoised per (overload, dtypes, ranks, emptiness, constant arguments, providers), in
    memory and, with a compile cache directory, on disk for later processes.
    """
    return probe_ops([node], providers, cache_dir)[node]


def probe_ops(
    nodes: Sequence[torch.fx.Node], providers: tuple[str, ...], cache_dir: str | None = None
) -> dict[torch.fx.Node, str | None]:
    """:func:`probe_op` for many nodes at once.

    Signatures not answered yet are first translated together, one node per signature in one
    graph: when every emitted ONNX node has a kernel they are all supported (one translation
    instead of one per op, ~2.5x less time). Otherwise, or if that graph fails to translate,
    each is probed alone, so the answers are the same as :func:`probe_op`'s.
    """
    results: dict[torch.fx.Node, str | None] = {}
    keys: dict[torch.fx.Node, str] = {}
    unknown: dict[str, torch.fx.Node] = {}
    table = _probe_table(cache_dir)
    for node in nodes:
        try:
            key = json.dumps(_probe_key(node, providers), default=str)
        except Exception:
            results[node] = _probe_uncached(node, providers)
            continue
        keys[node] = key
        with _probe_lock:
            if key in table:
                results[node] = table[key]
                continue
        unknown.setdefault(key, node)
    if len(unknown) > 1 and _all_supported(list(unknown.values()), providers):
        answers: dict[str, str | None] = dict.fromkeys(unknown)
    else:
        answers = {key: _probe_uncached(node, providers) for key, node in unknown.items()}
    if answers:
        with _probe_lock:
            if len(table) + len(answers) > 8192:
                table.clear()
            table.update(answers)
            _dirty.add(cache_dir)
    for node, key in keys.items():
        if node not in results:
            results[node] = answers[key]
    return results


def _all_supported(nodes: Sequence[torch.fx.Node], providers: tuple[str, ...]) -> bool:
    """Whether one graph holding every node (each with its own inputs) translates, passes ONNX
    type inference and every emitted ONNX node has an ORT kernel on ``providers``."""
    from ..export.fx import isolated_nodes_graph, translate

    try:
        return _translation_problem(translate(isolated_nodes_graph(nodes), name="probe", providers=providers), providers) is None
    except Exception:
        return False


_probe_tables: dict[str | None, dict[str, str | None]] = {}
_dirty: set[str | None] = set()


def _probe_table(cache_dir: str | None) -> dict[str, str | None]:
    with _probe_lock:
        table = _probe_tables.get(cache_dir)
        if table is not None:
            return table
    loaded: dict[str, str | None] = {}
    if cache_dir:
        from ..runtime.disk_cache import disk_cache

        cache = disk_cache(cache_dir)
        doc = cache.get_json("support") if cache is not None else None
        if isinstance(doc, dict):
            loaded = {str(k): v if isinstance(v, str) else None for k, v in doc.items()}
    with _probe_lock:
        return _probe_tables.setdefault(cache_dir, loaded)


def save_support_table(cache_dir: str | None) -> None:
    """Write the support answers learnt in this process to the compile cache (when changed)."""
    if not cache_dir or cache_dir not in _dirty:
        return
    from ..runtime.disk_cache import disk_cache

    cache = disk_cache(cache_dir)
    with _probe_lock:
        _dirty.discard(cache_dir)
        body = dict(_probe_tables.get(cache_dir, {}))
    if cache is not None:
        cache.put_json("support", body)


def _probe_uncached(node: torch.fx.Node, providers: tuple[str, ...]) -> str | None:
    from ..export.fx import single_node_graph, translate

    try:
        model = translate(single_node_graph(node), name="probe", providers=providers)
    except Exception as e:
        cause: BaseException = e
        while cause.__cause__ is not None:  # the exporter wraps the translation's own error
            cause = cause.__cause__
        first_line = (str(cause).strip().splitlines() or [""])[0][:200]
        with _probe_lock:
            if len(_probe_errors) > 1024:
                _probe_errors.clear()
            _probe_errors[str(node.target)] = f"{type(cause).__name__}: {first_line}"
        return Reason.EXPORT_FAILED
    return _translation_problem(model, providers)


def _translation_problem(model: Any, providers: tuple[str, ...]) -> str | None:
    """Why ORT cannot load a translated ``onnx_ir`` model (a single-op probe), or None.

    Checks every node against ORT's kernel registry, then again with local functions inlined
    and ONNX type inference run (strict): function bodies carry no types, so a node inside one
    (``Erf`` of a double in ``aten_special_erf``) is only typed after inlining, and a node whose
    declared output type contradicts its schema (torchlib's float16 ``native_layer_norm``) fails
    there instead of at session creation.
    """
    import onnx
    import onnx_ir as ir

    from ..export.fx import reinfer_types
    from ..runtime.kernels import kernel_registry, session_refusal, unsupported_nodes

    bad = unsupported_nodes(model, providers)
    if not bad:
        # types are what ORT checks at load; torch's shapes of unused auxiliary outputs (empty
        # save_mean of an eval batch norm) may differ from the ONNX op's without harm
        try:
            inferred = reinfer_types(ir.serde.serialize_model(model), inline=True)
        except onnx.shape_inference.InferenceError as e:
            return f"{Reason.BAD_TRANSLATION}: {str(e).splitlines()[0][:160]}"
        bad = unsupported_nodes(ir.serde.deserialize_model(inferred), providers)
    if bad:
        return f"{Reason.NO_KERNEL}: " + ", ".join(sorted({b.describe() for b in bad}))
    if not kernel_registry().complete:  # no kernel list to check against: ask ORT itself
        refusal = session_refusal(inferred.SerializeToString(), providers)
        if refusal is not None:
            return f"{Reason.NO_KERNEL}: {refusal}"
    return None

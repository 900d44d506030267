"""Split an aten FX graph into ORT regions and PyTorch code, and compile each region.

Supported nodes (see :mod:`ort_lazy.support`) are grouped with torch's
``CapabilityBasedPartitioner``; each group becomes one ONNX model run by an :class:`OrtRegion`.
A region whose export or session creation fails stays in PyTorch, counted and warned about once.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import operator
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _compat, metrics
from .export.fx import export_graph, spec_of
from .lowering import drop_unused_indices
from .options import Options
from .runtime.session import OrtModel, OrtRunError, OrtRunner, spec_from_json, spec_to_json
from .support import Reason, graph_reasons, op_name, save_support_table

__all__ = ["OrtRegion", "compile_graph", "graph_device", "GraphRecord", "recording"]

logger = logging.getLogger("ort_lazy")


@dataclass
class GraphRecord:
    """What :func:`compile_graph` decided for one graph (read by ``ort_lazy.explain``)."""

    tag: str
    ops: list[tuple[str, str | None]] = field(default_factory=list)  # (op, reason or None)
    regions: list[dict[str, Any]] = field(default_factory=list)


_recorders: list[list[GraphRecord]] = []


@contextlib.contextmanager
def recording() -> Iterator[list[GraphRecord]]:
    """Collect a :class:`GraphRecord` for every graph compiled inside the block."""
    records: list[GraphRecord] = []
    _recorders.append(records)
    try:
        yield records
    finally:
        _recorders.remove(records)


def graph_device(gm: torch.fx.GraphModule) -> torch.device:
    """The device of the graph's tensors: the first CUDA device seen, else CPU."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device
    return torch.device("cpu")


class _Support(OperatorSupportBase):
    def __init__(self, reasons: dict[torch.fx.Node, str | None]) -> None:
        self.reasons = reasons

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return self.reasons.get(node, Reason.NO_MAPPING) is None


class OrtRegion(torch.nn.Module):
    """One ORT-compiled region; falls back to its PyTorch graph if ORT fails at run time."""

    def __init__(self, name: str, torch_module: torch.fx.GraphModule, runner: OrtRunner | None,
                 options: Options, tuple_output: bool, constants: dict[int, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.name = name
        self.torch_module = torch_module
        # frozen inputs baked into the ONNX model: the caller no longer passes them
        self.constants = dict(sorted((constants or {}).items()))
        self.runner = runner
        self.options = options
        self.tuple_output = tuple_output
        self._run_type = options.run_type
        self._times = metrics.series(f"run:{name}")
        #: what explain shows for this region (filled in by compile_graph and autotune)
        self.report: dict[str, Any] = {}
        self.record: GraphRecord | None = None
        self._autotune_pending = options.autotune and options.run_type == "ort"
        # dynamic off: one concrete-shape model per input shape instead of one symbolic model
        symbolic = runner is not None and any(not s.static for s in runner.model.input_specs)
        self._per_shape: collections.OrderedDict[Any, OrtRunner | None] | None = (
            collections.OrderedDict() if symbolic and not options.dynamic else None
        )

    def forward(self, *args: Any) -> Any:
        runner = self.runner
        if runner is not None and self._per_shape is not None:
            runner = self._shape_runner(args)
        if runner is not None and self._autotune_pending:
            self._autotune_pending = False
            if not self._autotune(runner, args):
                self.runner = runner = None
        if runner is None or self._run_type == "pytorch":
            metrics.increment("torch_runs")
            return self._torch(args)
        start = time.perf_counter()
        try:
            outs = runner.run(args)
            self._times.append(time.perf_counter() - start)
        except OrtRunError as e:
            metrics.increment("ort_failures")
            metrics.warn_once(
                f"run:{self.name}:{e}",
                "ort-lazy: %s (%s); running it in PyTorch from now on",
                e,
                _ops_text(self.torch_module),
            )
            self.runner = None
            return self._torch(args)
        if self._run_type == "debug":
            from .debug.compare import compare_region

            compare_region(self.name, self.torch_module, self._full_args(args), outs, self.options)
        return tuple(outs) if self.tuple_output else outs[0]

    def _shape_runner(self, args: tuple[Any, ...]) -> OrtRunner | None:
        """The runner of a model exported for exactly these input shapes (bounded LRU)."""
        assert self._per_shape is not None
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        if key in self._per_shape:
            self._per_shape.move_to_end(key)
            return self._per_shape[key]
        runner = None
        try:
            from torch.fx.experimental.proxy_tensor import make_fx

            concrete = make_fx(self.torch_module, tracing_mode="fake")(*self._full_args(args))
            model = export_graph(concrete, f"{self.name}_{len(self._per_shape)}", self.constants or None)
            runner = OrtRunner(
                model, self.options, graph_device(concrete),
                spinning=self.runner.spinning if self.runner else True,
                threads=self.runner.threads if self.runner else None,
            )
        except Exception as e:  # this shape runs in PyTorch; others may still run on ORT
            metrics.increment("export_failures")
            metrics.warn_once(f"shape:{self.name}:{e}", "ort-lazy: %s for shapes %s runs in PyTorch: %s", self.name, key, e)
        self._per_shape[key] = runner
        while len(self._per_shape) > self.options.cache_size:
            self._per_shape.popitem(last=False)
        return runner

    def _autotune(self, runner: OrtRunner, args: tuple[Any, ...], calls: int = 5) -> bool:
        """Time this region on ORT and in PyTorch on real inputs; True when ORT is faster."""
        full = self._full_args(args)
        ort_t: list[float] = []
        torch_t: list[float] = []
        try:
            runner.run(args)
            self.torch_module(*full)
            for _ in range(calls):
                start = time.perf_counter()
                runner.run(args)
                ort_t.append(time.perf_counter() - start)
                start = time.perf_counter()
                self.torch_module(*full)
                torch_t.append(time.perf_counter() - start)
        except OrtRunError:
            return True  # the normal path reports and falls back
        ort_ms, torch_ms = statistics.median(ort_t) * 1e3, statistics.median(torch_t) * 1e3
        chosen = "ort" if ort_ms <= torch_ms else "pytorch"
        self.report["autotune"] = {"ort_ms": ort_ms, "pytorch_ms": torch_ms, "chosen": chosen}
        metrics.record_time(f"autotune_ort:{self.name}", ort_ms / 1e3)
        metrics.record_time(f"autotune_torch:{self.name}", torch_ms / 1e3)
        if chosen == "pytorch":
            metrics.increment("autotune_kept_in_pytorch")
            for n in self.torch_module.graph.nodes:
                if n.op == "call_function" and n.target is not operator.getitem:
                    metrics.record_fallback(op_name(n.target), Reason.AUTOTUNE)
                    if self.record is not None:
                        _mark(self.record, op_name(n.target), Reason.AUTOTUNE)
        logger.info("ort-lazy: autotune %s: ORT %.3f ms, PyTorch %.3f ms -> %s", self.name, ort_ms, torch_ms, chosen)
        return chosen == "ort"

    def _full_args(self, args: tuple[Any, ...]) -> list[Any]:
        full = list(args)
        for index, value in self.constants.items():
            full.insert(index, value)
        return full

    def _torch(self, args: tuple[Any, ...]) -> Any:
        return self.torch_module(*self._full_args(args)) if self.constants else self.torch_module(*args)


def _compute_nodes(nodes: Sequence[torch.fx.Node]) -> int:
    return sum(1 for n in nodes if n.op == "call_function" and n.target is not operator.getitem)


def _node_reasons(gm: torch.fx.GraphModule, options: Options, providers: Sequence[str]) -> dict[torch.fx.Node, str | None]:
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    reasons = graph_reasons([n for n in calls if n.target is not operator.getitem], options, providers)
    for node in calls:
        if node.target is operator.getitem:
            src = node.args[0]
            reasons[node] = reasons.get(src, Reason.NO_MAPPING) if isinstance(src, torch.fx.Node) else Reason.NO_MAPPING
    return {n: reasons[n] for n in calls}


def _record(reasons: dict[torch.fx.Node, str | None]) -> None:
    for node, reason in reasons.items():
        # Python-level ops and shape arithmetic (SymInt) are plumbing, not compute left behind.
        if reason is not None and reason != Reason.SYMBOLIC and isinstance(node.target, torch._ops.OpOverload):
            metrics.record_fallback(op_name(node.target), reason)
            metrics.warn_once(
                f"fallback:{op_name(node.target)}:{reason}",
                "ort-lazy: %s runs in PyTorch (%s)",
                op_name(node.target),
                reason,
            )


def _copy_placeholder_meta(parent: torch.fx.GraphModule, name: str) -> torch.fx.GraphModule:
    """Fused submodules' placeholders lack meta['val']: copy it from the parent's arguments."""
    sub = getattr(parent, name)
    call = next(n for n in parent.graph.nodes if n.op == "call_module" and n.target == name)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, arg in zip(placeholders, call.args):
        if isinstance(arg, torch.fx.Node):
            ph.meta["val"] = arg.meta.get("val", arg.meta.get("example_value"))
    return sub


#: Regions estimated below this many floating-point operations per call run on one ORT thread:
#: waking a second thread costs more than it saves (MLP 3x256, batch 32: 0.21 -> 0.17 ms/call on
#: 2 cores), and it competes with the caller's Python and PyTorch work.
SMALL_REGION_FLOPS = 16e6

_MATMULS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}


def estimated_flops(gm: torch.fx.GraphModule) -> float | None:
    """Rough floating-point work of one call of ``gm``: 2*M*N*K per matmul, 2*MACs per
    convolution, one per output element elsewhere; None when a shape is symbolic."""
    total = 0.0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        val = node.meta.get("val")
        outs = val if isinstance(val, (tuple, list)) else (val,)
        numel = 0
        for o in outs:
            if isinstance(o, torch.Tensor):
                if not all(isinstance(d, int) for d in o.shape):
                    return None
                numel += o.numel()
        name = op_name(node.target) if isinstance(node.target, torch._ops.OpOverload) else ""
        base = name.rsplit(".", 1)[0]
        if base in _MATMULS:
            a = node.args[1 if base in ("aten.addmm", "aten.baddbmm") else 0]
            k = a.meta["val"].shape[-1] if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) else 1
            if not isinstance(k, int):
                return None
            total += 2.0 * numel * k
        elif base == "aten.convolution":
            w = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
            macs = w[0].numel() if isinstance(w, torch.Tensor) and w.dim() > 1 else 1
            total += 2.0 * numel * macs
        else:
            total += numel
    return total


def region_threads(gm: torch.fx.GraphModule) -> int | None:
    """ORT intra-op threads for a region: 1 for small ones, None (PyTorch's count) otherwise
    (the runner applies it to CPU sessions only)."""
    flops = estimated_flops(gm)
    return 1 if flops is not None and flops < SMALL_REGION_FLOPS else None


def _tuple_output(gm: torch.fx.GraphModule) -> bool:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return isinstance(out.args[0], (tuple, list))


def _make_region(
    name: str,
    sub: torch.fx.GraphModule,
    options: Options,
    spinning: bool,
    constants: dict[int, torch.Tensor] | None = None,
) -> OrtRegion | None:
    """Export ``sub`` and open its ORT session; None (counted, warned once) when either fails."""
    device = graph_device(sub)
    try:
        model = _cached_export(sub, name, options, constants)
    except Exception as e:  # any export fault falls back: never crash the user's model
        metrics.increment("export_failures")
        _fallback_region(sub, Reason.EXPORT_FAILED)
        metrics.warn_once(
            f"export:{name}:{e}", "ort-lazy: export of %s (%s) failed, it runs in PyTorch: %s", name, _ops_text(sub), e
        )
        return None
    if options.dump_dir:
        from .debug.dump import dump_region

        try:
            dump_region(options.dump_dir, name, sub, model)
        except OSError as e:
            metrics.warn_once(f"dump:{options.dump_dir}", "ort-lazy: cannot write dumps to %s: %s", options.dump_dir, e)
    try:
        runner = OrtRunner(model, options, device, spinning=spinning, threads=region_threads(sub))
    except Exception as e:  # session creation faults (bad model, missing kernel, provider) fall back
        metrics.increment("ort_failures")
        _fallback_region(sub, Reason.ORT_FAILED)
        metrics.warn_once(f"session:{name}:{e}", "ort-lazy: ORT cannot run %s (%s), it runs in PyTorch: %s", name, _ops_text(sub), e)
        return None
    metrics.increment("regions_on_ort")
    return OrtRegion(name, sub, runner, options, _tuple_output(sub), constants)


def _cached_export(
    sub: torch.fx.GraphModule, name: str, options: Options, constants: dict[int, torch.Tensor] | None
) -> OrtModel:
    """export_graph, through the persistent compile cache when one is configured."""
    from .runtime.disk_cache import cache_key, disk_cache

    cache = disk_cache(options.cache_dir)
    if cache is None:
        return export_graph(sub, name, constants)
    specs = [spec_of(n.meta.get("val")) for n in sub.graph.nodes if n.op == "placeholder"]
    frozen = {str(i): _tensor_digest(t) for i, t in (constants or {}).items()}
    key = cache_key("region", sub.code, [spec_to_json(s) for s in specs], frozen, options.key(), graph_device(sub).type)
    hit = cache.get_model(key)
    if hit is not None:
        blob, data = hit
        return OrtModel(
            model_bytes=blob,
            input_names=data["input_names"],
            output_names=data["output_names"],
            input_specs=[spec_from_json(d) for d in data["input_specs"]],
            output_specs=[spec_from_json(d) for d in data["output_specs"]],
            name=name,
        )
    model = export_graph(sub, name, constants)
    cache.put_model(
        key,
        model.model_bytes,
        {
            "input_names": model.input_names,
            "output_names": model.output_names,
            "input_specs": [spec_to_json(s) for s in model.input_specs],
            "output_specs": [spec_to_json(s) for s in model.output_specs],
        },
    )
    return model


def _tensor_digest(t: torch.Tensor) -> str:
    import hashlib

    with _compat.real_tensor_mode():
        data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def _ops_text(sub: torch.fx.GraphModule, limit: int = 6) -> str:
    ops = sorted({op_name(n.target) for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem})
    return ", ".join(ops[:limit]) + (f" and {len(ops) - limit} more" if len(ops) > limit else "")


def _mark(record: GraphRecord, op: str, reason: str) -> None:
    """Change the first still-supported entry of ``op`` in ``record`` to ``reason``."""
    for i, (name, current) in enumerate(record.ops):
        if name == op and current is None:
            record.ops[i] = (name, reason)
            return


def _fallback_region(sub: torch.fx.GraphModule, reason: str) -> None:
    metrics.increment("fallback_regions")
    for node in sub.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            metrics.record_fallback(op_name(node.target), reason)


def compile_graph(
    gm: torch.fx.GraphModule,
    options: Options,
    *,
    tag: str = "graph",
    constants: dict[int, torch.Tensor] | None = None,
) -> torch.fx.GraphModule:
    """Replace every supported region of ``gm`` (aten ops, ``meta['val']`` set) by an ORT region.

    ``constants`` maps placeholder positions of ``gm`` to tensors (frozen weights) that regions
    bake into their ONNX models instead of taking as inputs.

    Returns the same GraphModule object, modified, or ``gm`` untouched when nothing runs on ORT.
    """
    start = time.perf_counter()
    metrics.increment("graphs_compiled")
    drop_unused_indices(gm)
    device = graph_device(gm)
    providers = options.resolve_providers(device)
    reasons = _node_reasons(gm, options, providers)
    _record(reasons)
    record = GraphRecord(tag)
    for node, reason in reasons.items():
        if isinstance(node.target, torch._ops.OpOverload) and reason != Reason.SYMBOLIC:
            record.ops.append((op_name(node.target), reason))
    for records in _recorders:
        records.append(record)

    partitioner = CapabilityBasedPartitioner(
        gm, _Support(reasons), allows_single_node_partition=True
    )
    partitions = partitioner.propose_partitions()
    kept = []
    for p in partitions:
        nodes = list(p.nodes)
        if _compute_nodes(nodes) < options.min_block_size:
            for n in nodes:
                if n.target is not operator.getitem:
                    metrics.record_fallback(op_name(n.target), Reason.SMALL_REGION)
                    _mark(record, op_name(n.target), Reason.SMALL_REGION)
            continue
        kept.append(p)
    if not kept:
        save_support_table(options.cache_dir)
        _finish(record, start)
        return gm

    # ORT's threads spin within a run and park when it ends (force_spinning_stop), so PyTorch
    # work between runs is not starved; measured faster than never spinning, alone or mixed
    spinning = options.allow_spinning if options.allow_spinning is not None else True
    frozen: dict[str, torch.Tensor] = {}  # by placeholder name (fusing may copy the nodes)
    if constants:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        frozen = {placeholders[i].name: t for i, t in constants.items() if i < len(placeholders)}
    fused = partitioner.fuse_partitions(kept)
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        name = node.target
        sub = _copy_placeholder_meta(fused, name)
        metrics.increment("regions_compiled")
        sub_constants = {
            j: frozen[a.name]
            for j, a in enumerate(node.args)
            if isinstance(a, torch.fx.Node) and a.op == "placeholder" and a.name in frozen
        }
        region = _make_region(f"{tag}_{name}", sub, options, spinning, sub_constants)
        if region is not None and sub_constants:
            node.args = tuple(a for j, a in enumerate(node.args) if j not in sub_constants)
        ops = [op_name(n.target) for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        entry = {"name": f"{tag}_{name}", "ops": ops, "on_ort": region is not None}
        record.regions.append(entry)
        if region is not None:
            region.report = entry
            region.record = record
            setattr(fused, name, region)
            # call the region's forward directly: skips nn.Module.__call__ (hooks) per call
            node.op, node.target = "call_function", region.forward
        else:
            for op in ops:
                _mark(record, op, Reason.EXPORT_FAILED + " / " + Reason.ORT_FAILED)
    fused.recompile()
    save_support_table(options.cache_dir)
    _finish(record, start)
    return fused


def _finish(record: GraphRecord, start: float) -> None:
    seconds = time.perf_counter() - start
    metrics.record_time("compile", seconds)
    metrics.append_compile_record(
        {
            "graph": record.tag,
            "compile_ms": seconds * 1e3,
            "ops": len(record.ops),
            "ops_on_ort": sum(1 for _, r in record.ops if r is None),
            "regions": record.regions,
            "fallbacks": [{"op": op, "reason": r} for op, r in record.ops if r is not None],
        }
    )

"""How a loaded model runs: its inputs flattened and checked (:class:`_Inputs`), then either the
direct plan of a model that is one ORT region (bound and run, with a thread trial as a compiled
region has) or the graph plan (``graph.json`` decoded, its PyTorch operators called and its
regions run on ORT, node by node).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .. import metrics
from ..specs import dim_symbols, parse_dim, spec_from_json
from .artifact_format import WEIGHTS, ArtifactError, resolve_op
from .artifact_regions import LoadedRegion
from .session_cache import session_cache
from .session_create import OrtRunError
from .threads import TRIAL_AFTER, ThreadTrial

__all__: list[str] = []


class _Inputs:
    """The saved model's inputs: their structure (flattened as the model was called when
    saved) and, per flat input, the dtype, rank, fixed dims and symbolic dims it must have."""

    def __init__(self, manifest: Mapping[str, Any]) -> None:
        inputs = manifest["inputs"]
        self.spec = pytree.treespec_loads(inputs["spec"])
        self.names = list(inputs.get("names", []))
        self.positional = int(inputs.get("positional", -1))
        specs = [spec_from_json(s) if s is not None else None for s in inputs["specs"]]
        self.count = len(specs)
        self.ranges = {str(k): (v[0], v[1]) for k, v in manifest.get("ranges", {}).items()}
        # per tensor input: (position, name, dtype, rank, [(dim, fixed size)], [(dim, symbol)])
        self.checks = [
            (
                i,
                self.names[i] if i < len(self.names) else str(i),
                s.dtype,
                len(s.shape),
                [(d, n) for d, n in enumerate(s.shape) if isinstance(n, int)],
                [(d, n) for d, n in enumerate(s.shape) if isinstance(n, str)],
            )
            for i, s in enumerate(specs)
            if s is not None
        ]

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        """The flat inputs of a call (positional calls of plain tensors take a shortcut)."""
        if not kwargs and len(args) == self.positional == self.count:
            return args
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.spec:
            # the same keyword arguments in another order
            _, expected = pytree.tree_unflatten([None] * self.spec.num_leaves, self.spec)
            if isinstance(expected, dict) and set(kwargs) == set(expected):
                flat, spec = pytree.tree_flatten((args, {k: kwargs[k] for k in expected}))
            if spec != self.spec:
                raise TypeError(f"the saved model takes inputs structured as {self.spec}, got {spec}")
        return flat

    def check(self, flat: Sequence[Any]) -> dict[str, int]:
        """Raise :class:`TypeError` / :class:`ValueError` unless every input is a host tensor
        of its dtype, rank and fixed dims, with equal sizes where the same symbol stands,
        each symbol's size within its saved range."""
        symbols: dict[str, int] = {}
        for i, name, dtype, rank, static, symbolic in self.checks:
            value = flat[i]
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"input {name!r}: expected a tensor, got {type(value).__name__}")
            if not value.is_cpu:
                raise ValueError(f"input {name!r} is on {value.device}; the saved model takes host (CPU) tensors")
            shape = value.shape
            if value.dtype != dtype or len(shape) != rank:
                raise ValueError(f"input {name!r}: expected {dtype} with {rank} dims, got {value.dtype} {tuple(shape)}")
            for d, n in static:
                if shape[d] != n:
                    raise ValueError(f"input {name!r}: dim {d} must be {n}, got {shape[d]} ({tuple(shape)})")
            for d, sym in symbolic:
                seen = symbols.setdefault(sym, shape[d])
                if seen != shape[d]:
                    raise ValueError(f"input {name!r}: dim {d} is {shape[d]}, another input's same dim ({sym}) is {seen}")
        for sym, n in symbols.items():
            low, high = self.ranges.get(sym, (None, None))
            if (low is not None and n < low) or (high is not None and n > high):
                raise ValueError(f"a dim saved as {sym} takes sizes {low}..{high if high is not None else 'inf'}, got {n}")
        return symbols


class _DirectPlan:
    """A model that is one ORT region: flatten the inputs, check them, run, rebuild the outputs."""

    def __init__(self, manifest: Mapping[str, Any], inputs: _Inputs, region: LoadedRegion) -> None:
        direct = manifest["direct"]
        self.inputs = inputs
        self.region = region
        # per model input: a flat input's index, or a size computed from the inputs' dims
        self.picks: list[Any] = [int(i) if isinstance(i, int) else _size_of(i, inputs) for i in direct["inputs"]]
        self.sized = any(callable(p) for p in self.picks)
        self.identity = self.picks == list(range(inputs.count))
        self.outputs = [int(i) for i in direct["outputs"]]
        self.out_spec = pytree.treespec_loads(manifest["outputs"]["spec"])
        self.leaf_out = self.out_spec.is_leaf()
        #: the runner's lean call (inputs are checked here), or its general run
        self.call = region.runner.tensor_call() or region.runner.run
        #: a thread trial (one thread against PyTorch's count, as a compiled region runs one):
        #: calls left before it starts, the trial, or None (none planned, or decided)
        self._trial: int | ThreadTrial | None = TRIAL_AFTER if region.plans_trial() else None
        self._calls: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        flat = self.inputs.flatten(args, kwargs)
        symbols = self.inputs.check(flat)
        if self.identity:
            picked = flat
        elif self.sized:
            picked = [p(symbols) if callable(p) else flat[p] for p in self.picks]
        else:
            picked = [flat[p] for p in self.picks]  # type: ignore[index]
        outs = self.call(picked) if self._trial is None else self._trial_call(picked)
        if self.leaf_out:
            return outs[self.outputs[0]]
        return pytree.tree_unflatten([outs[i] for i in self.outputs], self.out_spec)


    def _trial_call(self, picked: Sequence[Any]) -> list[torch.Tensor]:
        """A call while the thread trial is due or runs: on the runner whose turn it is,
        timed; at the verdict the faster runner stays and the other's session is dropped."""
        with self._lock:
            trial = self._trial
            runner = self.region.runner
            if isinstance(trial, int):
                if trial > 0:
                    self._trial = trial - 1
                    return self.call(picked)
                one = runner.threads == 1
                try:
                    other = self.region.reopened(one_thread=not one)
                except OrtRunError:
                    self._trial = None  # the planned runner stays
                    return self.call(picked)
                trial = self._trial = ThreadTrial(runner, other, runner if one else other)
            if not isinstance(trial, ThreadTrial):
                return self.call(picked)
            winner = trial.winner()
            if winner is not None:
                loser = trial.other(winner)
                if loser.cache_key != winner.cache_key:
                    session_cache().discard(loser.cache_key)
                self.region.runner = winner
                self.call = winner.tensor_call() or winner.run
                self._trial = None
                self._calls.clear()
                metrics.increment("thread_trials")
                return self.call(picked)
            runner = trial.runner()
            call = self._calls.get(id(runner))
            if call is None:
                call = self._calls[id(runner)] = runner.tensor_call() or runner.run
        start = time.perf_counter()
        outs = call(picked)
        with self._lock:
            if isinstance(self._trial, ThreadTrial):
                self._trial.record(runner, time.perf_counter() - start)
        return outs


def _size_of(pick: Any, inputs: _Inputs) -> Any:
    """A direct plan's size input: a function of the inputs' symbolic dims."""
    if not isinstance(pick, dict) or not isinstance(pick.get("expr"), str):
        raise ArtifactError(f"direct plan: unreadable input {str(pick)[:60]}")
    expr = pick["expr"]
    known = {sym for *_, symbolic in inputs.checks for _, sym in symbolic}
    try:
        fn = parse_dim(expr)
        if not dim_symbols(expr) <= known:
            raise ArtifactError(f"direct plan: size {expr!r} reads symbols no input has")
    except ValueError as e:
        raise ArtifactError(f"direct plan: {e}") from None
    return fn


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A graph value (by node index) read by a later node."""

    index: int


#: the Python functions a graph may call, by the name the artifact records
_FUNCTIONS: dict[str, Any] = {
    "getitem": operator.getitem,
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "neg": operator.neg,
    "truediv": operator.truediv,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "sym_max": torch.sym_max,
    "sym_min": torch.sym_min,
    "sym_not": torch.sym_not,
    "ceil": math.ceil,
    "floor": math.floor,
}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}


def _decode(value: Any, count: int) -> Any:
    """An argument as ``graph.json`` writes it, with node references as :class:`_Ref` (only to
    the ``count`` nodes before)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        raise ArtifactError("graph.json: an untagged list")
    if not isinstance(value, dict) or len(value) != 1:
        raise ArtifactError(f"graph.json: unreadable argument {str(value)[:60]}")
    ((tag, body),) = value.items()
    if tag == "node":
        if not isinstance(body, int) or not 0 <= body < count:
            raise ArtifactError(f"graph.json: a reference to node {body!r} before it is computed")
        return _Ref(body)
    if tag in ("list", "tuple"):
        items = [_decode(v, count) for v in body]
        return items if tag == "list" else tuple(items)
    if tag == "float" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag == "dtype":
        dtype = getattr(torch, str(body), None)
        if isinstance(dtype, torch.dtype):
            return dtype
    if tag == "device":
        return torch.device(str(body))
    if tag == "layout" and body in _LAYOUTS:
        return _LAYOUTS[body]
    if tag == "memory_format" and body in _MEMORY_FORMATS:
        return _MEMORY_FORMATS[body]
    raise ArtifactError(f"graph.json: unreadable argument {str(value)[:60]}")


def _has_refs(value: Any) -> bool:
    if isinstance(value, _Ref):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_refs(v) for v in value)
    if isinstance(value, dict):
        return any(_has_refs(v) for v in value.values())
    return False


def _resolve(value: Any, env: list[Any]) -> Any:
    if isinstance(value, _Ref):
        return env[value.index]
    if isinstance(value, list):
        return [_resolve(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    return value


class _GraphPlan:
    """A model with PyTorch operators between (or instead of) ORT regions: its graph run node by
    node (operators called, regions run on ORT), without grad."""

    def __init__(
        self, manifest: Mapping[str, Any], graph: Mapping[str, Any], inputs: _Inputs,
        regions: Mapping[str, LoadedRegion], weights: Mapping[str, torch.Tensor],
    ) -> None:
        self.inputs = inputs
        self.out_spec = pytree.treespec_loads(manifest["outputs"]["spec"])
        saved_torch = str(manifest["versions"].get("torch", "?"))
        steps: list[tuple[Any, ...]] = []
        for i, node in enumerate(graph.get("nodes", [])):
            if not isinstance(node, dict):
                raise ArtifactError(f"graph.json: node {i} is malformed")
            if "input" in node:
                index = node["input"]
                if not isinstance(index, int) or not 0 <= index < inputs.count:
                    raise ArtifactError(f"graph.json: node {i} reads input {index!r}, the model has {inputs.count}")
                steps.append(("input", index))
            elif "weight" in node:
                if node["weight"] not in weights:
                    raise ArtifactError(f"graph.json: node {i} reads weight {node['weight']!r}, which {WEIGHTS} lacks")
                steps.append(("value", weights[node["weight"]]))
            elif "region" in node:
                region = regions.get(str(node["region"]))
                if region is None:
                    raise ArtifactError(f"graph.json: node {i} runs region {node['region']!r}, which the manifest lacks")
                steps.append(("region", region, _decode(node["tensors"], i), _decode(node["sizes"], i)))
            elif "op" in node:
                op = resolve_op(str(node["op"]), node.get("schema"), saved_torch)
                kwargs = {str(k): _decode(v, i) for k, v in node.get("kwargs", {}).items()}
                steps.append(("call", op, _decode(node["args"], i), kwargs))
            elif "fn" in node and node["fn"] in _FUNCTIONS:
                steps.append(("call", _FUNCTIONS[node["fn"]], _decode(node["args"], i), {}))
            else:
                raise ArtifactError(f"graph.json: node {i} is of no known kind ({sorted(node)[:4]})")
        self.steps = steps
        self.outputs = _decode(graph.get("outputs"), len(steps))
        if not isinstance(self.outputs, list) or len(self.outputs) != self.out_spec.num_leaves:
            raise ArtifactError("graph.json: its outputs do not match the outputs' structure")

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        flat = self.inputs.flatten(args, kwargs)
        self.inputs.check(flat)
        env: list[Any] = []
        append = env.append
        with torch.no_grad():
            for step in self.steps:
                kind = step[0]
                if kind == "input":
                    append(flat[step[1]])
                elif kind == "value":
                    append(step[1])
                elif kind == "region":
                    append(step[1].run(_resolve(step[2], env), _resolve(step[3], env)))
                else:
                    append(step[1](*_resolve(step[2], env), **_resolve(step[3], env)))
        return pytree.tree_unflatten(_resolve(self.outputs, env), self.out_spec)

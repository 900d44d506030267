"""Saved models: the artifact's format, its checks, the ``ort_lazy::region`` op and the loader.

An artifact (:func:`ort_lazy.save` writes it) is one zip file, its members stored uncompressed:

``manifest.json``
    format and versions (torch, onnxruntime, ort-lazy, each region's ONNX IR version and
    opsets), the providers it was made for, the sha256 and size of every other member, the
    regions (their input/output specs, the ops they run, which weight backs each external
    initializer), the weights' index, the inputs' and outputs' structure, and the direct plan of
    a model that is one ORT region.
``graph.json``
    the model's graph as the loader runs it: user inputs, weights, ORT region calls, the
    PyTorch operators between regions (by name, with the schema they had when saved), the
    outputs.
``regions/<id>.onnx``
    each region's ONNX model. Weights bound to a region are external initializers: the model
    declares them, their data is in ``weights.bin``, and the session is given that memory,
    which ORT prepacks. No weight is stored twice.
``weights.bin``
    the raw bytes of every weight (regions' and the PyTorch operators'), each at an offset
    aligned to 64 bytes.
``program.pt2`` (only with ``save(..., program=True)``)
    the model as a ``torch.export`` program (:func:`torch.export.save`) whose ORT regions are
    calls of the ``ort_lazy::region`` op, for tools that read one; loading never reads it.

Loading verifies the size and sha256 of every member before anything is parsed or
deserialized, checks the versions (:func:`check_versions`), and opens each region's session
with the providers and session options chosen at load. Nothing is unpickled: the manifest
and graph are JSON, weights raw bytes, ONNX models protobuf. Loading never traces, exports,
imports dynamo or the ONNX exporter (``torch.export.load`` would import both: it reads
``program.pt2`` only when :attr:`LoadedModel.program` is asked for).

A model that is one ORT region (every op on ORT) is called through a direct path: inputs
flattened and checked, bound to the session and run. Other models run their graph: each
PyTorch operator called, each region run on ORT, in order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import math
import operator
import os
import threading
import time
import weakref
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .. import metrics
from .._version import __version__
from ..opnames import lookup
from ..options import Options
from ..specs import OrtModel, dim_symbols, parse_dim, spec_from_json
from .flavour import max_ir_version, onnxruntime, ort_version, provider_problem
from .region import open_runner
from .session import OrtRunError, OrtRunner, session_cache
from .threads import TRIAL_AFTER, ThreadTrial, model_flops, thread_trial

__all__ = [
    "ArtifactError",
    "FORMAT",
    "FORMAT_VERSION",
    "LoadedModel",
    "LoadedRegion",
    "check_versions",
    "dim_value",
    "load",
    "read_artifact",
    "write_artifact",
    "summary",
    "REGION_OP",
]

#: the ``format`` field of every manifest
FORMAT = "ort-lazy-artifact"
#: the layout version this ort-lazy writes; it reads this one and older ones
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAM = "program.pt2"
GRAPH = "graph.json"
WEIGHTS = "weights.bin"
#: weights in ``weights.bin`` start at multiples of this many bytes
WEIGHT_ALIGNMENT = 64
#: the largest manifest read (a larger one is not an artifact's)
MAX_MANIFEST_BYTES = 64 << 20

#: the oldest onnxruntime (major, minor) that runs each ``ai.onnx`` opset (its release notes)
ORT_FOR_OPSET = {17: (1, 13), 18: (1, 14), 19: (1, 16), 20: (1, 17), 21: (1, 18), 22: (1, 20), 23: (1, 22)}


class ArtifactError(Exception):
    """The artifact cannot be loaded as it is: not an artifact, truncated or damaged, a member
    whose hash differs (tampered), a layout or version this installation cannot honour."""


# -- the region op ------------------------------------------------------------------------------

_LIB = torch.library.Library("ort_lazy", "DEF")
_LIB.define("region(Tensor[] inputs, SymInt[] sizes, str region) -> Tensor[]")
#: the op standing for an ORT region in a saved program: ``inputs`` are the region's tensor
#: inputs, ``sizes`` its integer ones (symbolic sizes the graph computes), ``region`` the key of
#: the loaded region that runs it
REGION_OP = torch.ops.ort_lazy.region.default

_REGIONS: dict[str, LoadedRegion] = {}
_regions_lock = threading.Lock()
_load_ids = itertools.count()


def _region(key: str) -> LoadedRegion:
    region = _REGIONS.get(key)
    if region is None:
        raise ArtifactError(
            f"ORT region {key!r} is not loaded: a program with ort_lazy::region calls runs through "
            "ort_lazy.load(path), which opens its regions"
        )
    return region


def _run_region(inputs: list[torch.Tensor], sizes: list[int], region: str) -> list[torch.Tensor]:
    return _region(region).run(inputs, sizes)


def _fake_region(inputs: list[torch.Tensor], sizes: list[Any], region: str) -> list[torch.Tensor]:
    """Outputs of the region's dtypes and shapes, symbolic dims computed from the inputs'
    sizes (fake tensors: re-tracing a loaded program keeps its dynamic dims)."""
    return _region(region).fake(inputs, sizes)


_LIB.impl("region", _run_region, "CompositeExplicitAutograd")
torch.library.register_fake("ort_lazy::region", _fake_region, lib=_LIB)


# -- symbolic dims --------------------------------------------------------------------------------


def dim_value(expr: str, symbols: Mapping[str, Any]) -> Any:
    """The value of a symbolic dim's expression (:func:`~ort_lazy.specs.parse_dim`) with
    ``symbols`` bound. Raises :class:`ArtifactError` for an expression it does not read or a
    symbol not bound."""
    try:
        return parse_dim(expr)(symbols)
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    except KeyError as e:
        raise ArtifactError(f"dim {expr!r}: symbol {e.args[0]!r} is not among the region's input sizes") from None


def _symbols_of(dims: Sequence[Any]) -> set[str]:
    names: set[str] = set()
    for d in dims:
        if isinstance(d, str):
            try:
                names |= dim_symbols(d)
            except ValueError as e:
                raise ArtifactError(str(e)) from None
    return names


# -- reading and writing ---------------------------------------------------------------------------


def _sha256(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def write_artifact(path: str | os.PathLike[str], manifest: dict[str, Any], members: Mapping[str, bytes]) -> None:
    """Write an artifact: ``members`` (name -> bytes) and the manifest, which gets every
    member's size and sha256 (``manifest["members"]``). Written to a temporary file beside
    ``path`` and moved into place, so ``path`` never holds a partial artifact."""
    manifest = dict(manifest)
    manifest["members"] = {name: {"size": len(data), "sha256": _sha256(data)} for name, data in sorted(members.items())}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    target = os.fspath(path)
    tmp = f"{target}.tmp{os.getpid()}"
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr(MANIFEST, text)
            for name, data in sorted(members.items()):
                z.writestr(name, data)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclasses.dataclass
class Artifact:
    """A read artifact: its manifest and its members' bytes, every one verified."""

    path: str
    manifest: dict[str, Any]
    members: dict[str, bytes]


def read_artifact(path: str | os.PathLike[str], *, skip: Sequence[str] = ()) -> Artifact:
    """Read and verify the artifact at ``path``: a zip whose members are exactly those the
    manifest lists, each of the size and sha256 it records (members named in ``skip`` are not
    read, and verified only for their listed size). Nothing is parsed but the manifest (JSON).

    Raises:
        ArtifactError: missing, not a zip, truncated, a member missing, extra, damaged or
            tampered with, or a manifest of another format or a newer layout.
    """
    where = os.fspath(path)
    try:
        archive = zipfile.ZipFile(where)
    except FileNotFoundError:
        raise ArtifactError(f"{where}: no such artifact") from None
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise ArtifactError(f"{where}: not an ort-lazy artifact, or truncated ({e})") from None
    with archive:
        names = archive.namelist()
        if MANIFEST not in names:
            raise ArtifactError(f"{where}: not an ort-lazy artifact (no {MANIFEST})")
        try:
            if archive.getinfo(MANIFEST).file_size > MAX_MANIFEST_BYTES:
                raise ArtifactError(f"{where}: {MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
            manifest = json.loads(archive.read(MANIFEST))
        except ArtifactError:
            raise
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise ArtifactError(f"{where}: damaged {MANIFEST} ({e})") from None
        _check_format(manifest, where)
        listed = manifest["members"]
        extra = sorted(set(names) - set(listed) - {MANIFEST})
        if extra:
            raise ArtifactError(f"{where}: members the manifest does not list: {extra[:5]} (tampered with?)")
        missing = sorted(set(listed) - set(names))
        if missing:
            raise ArtifactError(f"{where}: members missing: {missing[:5]} (truncated?)")
        members: dict[str, bytes] = {}
        for name, entry in listed.items():
            info = archive.getinfo(name)
            if info.file_size != entry.get("size"):
                raise ArtifactError(f"{where}: member {name} has {info.file_size} bytes, the manifest says {entry.get('size')}")
            if name in skip:
                continue
            try:
                data = archive.read(name)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
                raise ArtifactError(f"{where}: member {name} is damaged or truncated ({e})") from None
            if _sha256(data) != entry.get("sha256"):
                raise ArtifactError(f"{where}: member {name} does not match its sha256 in the manifest (tampered with or damaged)")
            members[name] = data
    return Artifact(where, manifest, members)


def _check_format(manifest: Any, where: str) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{where}: not an ort-lazy artifact (manifest format {str(manifest.get('format') if isinstance(manifest, dict) else None)!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise ArtifactError(f"{where}: bad format_version {version!r}")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{where}: made by ort-lazy {manifest.get('versions', {}).get('ort_lazy')} in layout {version}; "
            f"this ort-lazy ({__version__}) reads layouts up to {FORMAT_VERSION}: upgrade ort-lazy"
        )
    for key, kind in (("members", dict), ("regions", list), ("versions", dict), ("inputs", dict), ("outputs", dict)):
        if not isinstance(manifest.get(key), kind):
            raise ArtifactError(f"{where}: manifest field {key!r} missing or malformed")
    if GRAPH not in manifest["members"]:
        raise ArtifactError(f"{where}: the manifest lists no {GRAPH}")


def _minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ArtifactError(f"unreadable version {version!r}") from None


def check_versions(manifest: Mapping[str, Any], *, program: bool = False, where: str = "artifact") -> None:
    """Refuse what this installation cannot honour, saying what and why:

    * every region's ONNX IR version and ``ai.onnx`` opset must be ones the installed
      onnxruntime runs (:data:`ORT_FOR_OPSET`); a newer onnxruntime than the artifact's is fine;
    * ``program``: the ``torch.export`` program (``program.pt2``) loads only in the torch minor
      version it was saved with (torch.export's own rule). The graph the loader runs has no
      such limit: its operators are checked one by one (:func:`resolve_op`).

    Raises:
        ArtifactError: a mismatch, naming the versions on both sides.
    """
    versions = manifest["versions"]
    saved_torch = str(versions.get("torch", "?"))
    if program and _minor(saved_torch) != _minor(torch.__version__):
        raise ArtifactError(
            f"{where}: its torch.export program was saved with torch {saved_torch}; such programs load in the same "
            f"torch minor version, this is torch {torch.__version__} (the model itself loads: ort_lazy.load runs it "
            "without the program)"
        )
    installed = ort_version()
    limit = max_ir_version()
    newest = max(ORT_FOR_OPSET)
    for region in manifest["regions"]:
        ir = int(region.get("ir_version", 0))
        if ir > limit:
            raise ArtifactError(
                f"{where}: region {region.get('id')} is ONNX IR version {ir}; the installed onnxruntime "
                f"{onnxruntime().__version__} reads up to {limit} (the artifact was made with onnxruntime "
                f"{versions.get('onnxruntime')}): upgrade onnxruntime"
            )
        opset = int(region.get("opsets", {}).get("", 0))
        # an opset newer than the table: at least the onnxruntime that made the artifact
        needed = ORT_FOR_OPSET.get(opset, (0, 0)) if opset <= newest else _minor(str(versions.get("onnxruntime", "0.0")))
        if installed < needed:
            raise ArtifactError(
                f"{where}: region {region.get('id')} uses ONNX opset {opset}, which needs onnxruntime >= "
                f"{needed[0]}.{needed[1]}; installed: {onnxruntime().__version__} (the artifact was made with "
                f"{versions.get('onnxruntime')})"
            )


def resolve_op(name: str, schema: str | None, saved_torch: str) -> Any:
    """The operator ``name`` (``aten.cumsum.default``, :func:`~ort_lazy.opnames.op_name`'s
    spelling) of the installed torch, when it has the ``schema`` it had when saved.

    Raises:
        ArtifactError: no such operator (another library's, not imported?) or another schema.
    """
    parts = name.split(".")
    op = lookup(name) if len(parts) == 3 and all(parts) else None
    if op is None:
        namespace = parts[0]
        raise ArtifactError(
            f"the model calls operator {name}, which this torch ({torch.__version__}) does not have"
            + ("" if namespace == "aten" else f" (import the library that defines {namespace} ops before loading)")
        )
    if not isinstance(op, torch._ops.OpOverload):
        raise ArtifactError(f"{name} is not an operator")
    if schema is not None and str(op._schema) != schema:
        raise ArtifactError(
            f"operator {name} changed between torch {saved_torch} (saved: {schema}) and this torch "
            f"{torch.__version__} ({op._schema}): save the model again with this torch"
        )
    return op


def summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What the artifact at ``path`` holds (verified, nothing deserialized): versions, the
    providers it was made for, its regions with their ops, its members' sizes, how it runs."""
    art = read_artifact(path)
    m = art.manifest
    regions = [
        {
            "id": r["id"],
            "ops": r.get("ops", []),
            "inputs": [_shape_text(d) for d in r["model"]["inputs"]],
            "outputs": [_shape_text(d) for d in r["model"]["outputs"]],
            "opsets": r.get("opsets", {}),
            "ir_version": r.get("ir_version"),
            "initializers": len(r.get("initializers", [])),
        }
        for r in m["regions"]
    ]
    return {
        "path": art.path,
        "format_version": m["format_version"],
        "versions": m["versions"],
        "providers": m.get("providers", []),
        "runs": "direct (one ORT region)" if m.get("direct") else "graph (ORT regions and PyTorch operators)",
        "program": PROGRAM in m["members"],
        "inputs": m["inputs"].get("names", []),
        "regions": regions,
        "ops_in_pytorch": m.get("pytorch_ops", []),
        "weights": {"count": len(m.get("weights", {})), "bytes": sum(w["nbytes"] for w in m.get("weights", {}).values())},
        "members": {name: e["size"] for name, e in m["members"].items()},
        "size": os.path.getsize(art.path),
    }


def _shape_text(desc: Mapping[str, Any]) -> str:
    return f"{desc.get('name')}: {desc.get('dtype')}[{', '.join(map(str, desc.get('shape', [])))}]"


# -- loaded regions ---------------------------------------------------------------------------------


class LoadedRegion:
    """One region of a loaded artifact: its ORT runner and how the op's arguments map to the
    model's inputs. Loaded regions have no PyTorch twin: an ORT failure raises
    :class:`~ort_lazy.runtime.session.OrtRunError`, never a silent fallback."""

    def __init__(
        self, key: str, entry: Mapping[str, Any], runner: OrtRunner, options: Options | None = None,
        weights: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        self.key = key
        self.id = str(entry["id"])
        self.runner = runner
        self.options = options or runner.options
        self.weights = dict(weights or {})
        self.model = runner.model
        #: per model input: ("t", i) the op's i-th tensor, ("s", j) its j-th size
        self.arrangement: list[tuple[str, int]] = [(str(k), int(i)) for k, i in entry["arrangement"]]
        self.size_symbols: list[str | None] = [s if isinstance(s, str) else None for s in entry.get("size_symbols", [])]
        self.ops = list(entry.get("ops", []))
        specs = self.model.output_specs[: len(self.model.output_specs) - self.model.checks]
        self._outputs = specs
        # every output dim's expression parses, and reads only symbols the inputs bind
        known = _symbols_of([d for s in self.model.input_specs for d in s.shape] + [s for s in self.size_symbols if s])
        unknown = _symbols_of([d for s in specs for d in s.shape]) - known
        if unknown:
            raise ArtifactError(f"region {self.id}: output dims read symbols no input binds: {sorted(unknown)}")
        self._identity = all(k == "t" and i == n for n, (k, i) in enumerate(self.arrangement))

    def reopened(self, one_thread: bool) -> OrtRunner:
        """A runner of this region's model on one thread, or on PyTorch's count."""
        return open_runner(
            self.model, self.options, self.runner.device, spinning=self.runner.spinning, weights=self.weights, one_thread=one_thread
        )

    def plans_trial(self) -> bool:
        """Whether the region's thread count is worth a trial, as a compiled region's is
        (:func:`~ort_lazy.runtime.threads.thread_trial`): CPU, more than one PyTorch thread, no
        thread count in ``session_options``, work in the trial's range."""
        return (
            self.runner.device.type == "cpu"
            and torch.get_num_threads() >= 2
            and "intra_op_num_threads" not in self.options.session_options
            and thread_trial(model_flops(self.model))
        )

    def run(self, tensors: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        """The region's outputs for the op's arguments, computed by ORT."""
        if self._identity and not sizes:
            return self.runner.run(tensors)
        return self.runner.run([tensors[i] if k == "t" else sizes[i] for k, i in self.arrangement])

    def fake(self, tensors: Sequence[torch.Tensor], sizes: Sequence[Any]) -> list[torch.Tensor]:
        """Empty tensors of the outputs' dtypes and shapes for these (fake) inputs."""
        symbols: dict[str, Any] = {}
        for (kind, i), spec in zip(self.arrangement, self.model.input_specs):
            if kind == "t":
                for dim, value in zip(spec.shape, tensors[i].shape):
                    if isinstance(dim, str) and dim not in symbols:
                        symbols[dim] = value
            elif (symbol := self.size_symbols[i]) and symbol.isidentifier():
                symbols.setdefault(symbol, sizes[i])
        device = tensors[0].device if tensors else self.runner.device
        return [
            torch.empty([dim_value(d, symbols) if isinstance(d, str) else d for d in spec.shape], dtype=spec.dtype, device=device)
            for spec in self._outputs
        ]


def _weights_from(data: bytes, index: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of ``weights.bin`` (one writable copy of its bytes, which they view)."""
    if not index:
        return {}
    buffer = bytearray(data)
    out: dict[str, torch.Tensor] = {}
    for name, entry in index.items():
        dtype = getattr(torch, str(entry["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ArtifactError(f"weight {name}: unknown dtype {entry['dtype']!r}")
        shape = [int(d) for d in entry["shape"]]
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > len(buffer) or nbytes != math.prod(shape) * itemsize or offset % itemsize:
            raise ArtifactError(f"weight {name}: its bytes ({offset}+{nbytes}) do not fit {WEIGHTS} or its shape")
        if nbytes == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
        out[name] = flat.view(dtype).reshape(shape)
    return out


# -- the loaded model ------------------------------------------------------------------------------


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


def _forget(keys: Sequence[str]) -> None:
    with _regions_lock:
        for key in keys:
            _REGIONS.pop(key, None)


class LoadedModel:
    """A model loaded from an artifact: call it like the model it was saved from (outputs in
    plain containers: tuples, lists, dicts). See :func:`load`."""

    def __init__(self, artifact: Artifact, regions: dict[str, LoadedRegion], load_id: str, plan: _DirectPlan | _GraphPlan) -> None:
        self.path = artifact.path
        #: the artifact's manifest (versions, providers, regions, members)
        self.manifest = artifact.manifest
        #: the regions by their id in the artifact
        self.regions = regions
        self._load_id = load_id
        self._plan = plan
        self._program: Any = None
        self._lock = threading.Lock()
        weakref.finalize(self, _forget, [r.key for r in regions.values()])

    @property
    def direct(self) -> bool:
        """Whether calls take the direct path (the model is one ORT region)."""
        return isinstance(self._plan, _DirectPlan)

    @property
    def program(self) -> Any:
        """The ``torch.export.ExportedProgram`` of an artifact saved with ``program=True``, its
        ORT regions ``ort_lazy::region`` calls bound to this load's sessions (``.module()``
        runs it). Read on first use with ``torch.export.load`` (which imports dynamo).

        Raises:
            ArtifactError: the artifact has no program, or this torch cannot read it
                (:func:`check_versions`).
        """
        with self._lock:
            if self._program is None:
                if PROGRAM not in self.manifest["members"]:
                    raise ArtifactError(f"{self.path} holds no torch.export program: save it with program=True")
                self._program = _read_program(self.path, self.manifest, self._load_id)
            return self._program

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._plan(args, kwargs)

    def __repr__(self) -> str:
        kind = "direct" if self.direct else "graph"
        return f"LoadedModel({self.path!r}, regions={len(self.regions)}, {kind})"


def _read_program(path: str, manifest: Mapping[str, Any], load_id: str) -> Any:
    check_versions(manifest, program=True, where=path)
    artifact = read_artifact(path)
    if artifact.manifest != manifest:
        raise ArtifactError(f"{path} changed since it was loaded")
    try:
        program = torch.export.load(io.BytesIO(artifact.members[PROGRAM]))
    except Exception as e:
        raise ArtifactError(f"{path}: its program cannot be read: {type(e).__name__}: {e}") from e
    calls = 0
    for node in program.graph_module.graph.nodes:
        if node.op == "call_function" and node.target is REGION_OP:
            node.args = (*node.args[:2], f"{load_id}/{node.args[2]}")
            calls += 1
    program.graph_module.recompile()
    if calls != len(manifest["regions"]):
        raise ArtifactError(f"{path}: its program calls {calls} regions, the manifest lists {len(manifest['regions'])}")
    return program


def load(path: str | os.PathLike[str], options: Options | None = None) -> LoadedModel:
    """Load the artifact at ``path`` and open its regions' ORT sessions with ``options``
    (providers, provider options, session options: chosen here, not at save).

    Every member is verified (size, sha256) before anything is parsed; the versions are checked
    (:func:`check_versions`), the graph's operators resolved (:func:`resolve_op`). No dynamo
    trace, no ONNX export, no import of dynamo or of the exporter.

    Raises:
        ArtifactError: the artifact is damaged, tampered with, or needs versions or providers
            this installation does not have.
    """
    options = options or Options.from_env()
    artifact = read_artifact(path, skip=(PROGRAM,))
    where = artifact.path
    manifest = artifact.manifest
    check_versions(manifest, where=where)
    problem = provider_problem(options.resolve_providers(torch.device("cpu")))
    if problem is not None:
        raise ArtifactError(f"{where}: {problem}")
    try:
        graph = json.loads(artifact.members[GRAPH])
    except ValueError as e:
        raise ArtifactError(f"{where}: unreadable {GRAPH} ({e})") from None
    if not isinstance(graph, dict):
        raise ArtifactError(f"{where}: unreadable {GRAPH}")
    weights = _weights_from(artifact.members.get(WEIGHTS, b""), manifest.get("weights", {}))
    load_id = f"L{next(_load_ids)}"
    regions: dict[str, LoadedRegion] = {}
    made: list[str] = []
    try:
        for entry in manifest["regions"]:
            region = _open_region(artifact, entry, options, weights, load_id)
            regions[region.id] = region
            with _regions_lock:
                _REGIONS[region.key] = region
            made.append(region.key)
        inputs = _Inputs(manifest)
        direct = manifest.get("direct")
        if direct:
            plan: _DirectPlan | _GraphPlan = _DirectPlan(manifest, inputs, regions[str(direct["region"])])
        else:
            plan = _GraphPlan(manifest, graph, inputs, regions, weights)
    except (KeyError, TypeError, ValueError) as e:
        _forget(made)
        raise ArtifactError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None
    except BaseException:
        _forget(made)
        raise
    metrics.increment("artifacts_loaded")
    return LoadedModel(artifact, regions, load_id, plan)


def _open_region(
    artifact: Artifact, entry: Mapping[str, Any], options: Options, weights: dict[str, torch.Tensor], load_id: str
) -> LoadedRegion:
    where = artifact.path
    rid = str(entry["id"])
    member = f"regions/{rid}.onnx"
    if member not in artifact.members:
        raise ArtifactError(f"{where}: region {rid} has no model ({member})")
    try:
        model = OrtModel.from_description(artifact.members[member], entry["model"], rid)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{where}: region {rid}: malformed description ({e})") from None
    bound: dict[int, torch.Tensor] = {}
    for init in entry.get("initializers", []):
        name, key = init["name"], init["weight"]
        tensor = weights.get(key)
        if tensor is None:
            raise ArtifactError(f"{where}: region {rid}: weight {key!r} of initializer {name} is not in {WEIGHTS}")
        position = model.external.get(name)
        if position is None:
            raise ArtifactError(f"{where}: region {rid}: the model declares no external initializer {name}")
        dtype = getattr(torch, str(init.get("dtype")), None)
        if tensor.dtype != dtype or list(tensor.shape) != list(init.get("shape", ())):
            raise ArtifactError(f"{where}: region {rid}: weight {key!r} is {tensor.dtype}{list(tensor.shape)}, the model declares {init.get('dtype')}{init.get('shape')}")
        bound[position] = tensor
    if set(bound) != set(model.external.values()):
        missing = sorted(set(model.external) - {i["name"] for i in entry.get("initializers", [])})
        raise ArtifactError(f"{where}: region {rid}: external initializers without data: {missing}")
    spinning = options.allow_spinning if options.allow_spinning is not None else True
    try:
        runner = open_runner(model, options, torch.device("cpu"), spinning=spinning, weights=bound)
    except OrtRunError as e:
        versions = artifact.manifest["versions"]
        raise ArtifactError(
            f"{where}: ORT cannot open region {rid} (made with onnxruntime {versions.get('onnxruntime')} for "
            f"{', '.join(artifact.manifest.get('providers', []))}; installed {onnxruntime().__version__}): {e}"
        ) from e
    return LoadedRegion(f"{load_id}/{rid}", entry, runner, options, bound)

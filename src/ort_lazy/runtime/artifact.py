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

The format and its checks are in :mod:`~ort_lazy.runtime.artifact_format`, the region op and the
loaded regions in :mod:`~ort_lazy.runtime.artifact_regions`, how a loaded model runs in
:mod:`~ort_lazy.runtime.artifact_plans`; their public names are importable from here as well.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .. import metrics
from ..options import Options
from ..specs import OrtModel
from .artifact_format import (
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    ORT_FOR_OPSET,
    PROGRAM,
    WEIGHT_ALIGNMENT,
    WEIGHTS,
    Artifact,
    ArtifactError,
    check_versions,
    read_artifact,
    resolve_op,
    summary,
    write_artifact,
)
from .artifact_plans import _DirectPlan, _GraphPlan, _Inputs
from .artifact_regions import _REGIONS, REGION_OP, LoadedRegion, _regions_lock, _weights_from, dim_value
from .flavour import onnxruntime, provider_problem
from .region import open_runner
from .session_create import OrtRunError

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
    # the format's other names, made in artifact_format
    "Artifact",
    "MANIFEST",
    "PROGRAM",
    "GRAPH",
    "WEIGHTS",
    "WEIGHT_ALIGNMENT",
    "MAX_MANIFEST_BYTES",
    "ORT_FOR_OPSET",
    "resolve_op",
]

_load_ids = itertools.count()


# -- the loaded model ------------------------------------------------------------------------------


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

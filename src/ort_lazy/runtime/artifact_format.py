"""The artifact's format and its checks: the zip's members and the manifest's fields, writing an
artifact, reading one back with every member verified (size, sha256), the versions an
installation must have to load it, and the operators its graph calls.

:mod:`ort_lazy.runtime.artifact` describes the layout and loads artifacts; nothing here opens a
session or deserializes more than the manifest (JSON).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._version import __version__
from ..opnames import lookup
from .flavour import max_ir_version, onnxruntime, ort_version

__all__ = [
    "ArtifactError",
    "Artifact",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "PROGRAM",
    "GRAPH",
    "WEIGHTS",
    "WEIGHT_ALIGNMENT",
    "MAX_MANIFEST_BYTES",
    "ORT_FOR_OPSET",
    "check_versions",
    "read_artifact",
    "resolve_op",
    "summary",
    "write_artifact",
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

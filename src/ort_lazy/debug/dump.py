"""``ORT_LAZY_DUMP_DIR``: per compiled region, the ONNX model, the source graph and the input schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..specs import OrtModel

__all__ = ["dump_region"]


def dump_region(directory: str, name: str, source: Any, model: OrtModel) -> Path:
    """Write ``<name>_<digest>.onnx``, ``.graph.txt`` and ``.schema.json``; returns the common prefix.

    ``source`` is an FX GraphModule (its code is written) or any object whose ``str`` is the
    graph (TorchScript IR).
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    prefix = root / f"{name}_{model.digest[:12]}"
    _atomic_write(prefix.with_suffix(".onnx"), model.model_bytes)
    text = getattr(source, "code", None) or str(source)
    _atomic_write(prefix.with_suffix(".graph.txt"), text.encode())
    schema = {"region": name, "digest": model.digest, **model.describe()}
    _atomic_write(prefix.with_suffix(".schema.json"), json.dumps(schema, indent=2).encode())
    return prefix


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

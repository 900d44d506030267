"""The persistent compile cache (``ORT_LAZY_CACHE_DIR`` / ``Options.cache_dir``).

Exported ONNX models (and the support table's answers) survive across processes, so a second
process skips the exporter entirely. Safety rules:

* entries are keyed by a SHA-256 of the graph, input schema, providers, options and the torch /
  onnxruntime / ort-lazy versions, so a foreign-version entry is never even looked up;
* each entry records the SHA-256 and size of its payload, verified before use: a tampered,
  truncated or corrupt entry is logged, deleted and rebuilt, never loaded;
* nothing is unpickled or executed: payloads are ONNX bytes and JSON;
* a directory it creates is private to the user (0700), an existing one keeps its permissions;
  files are 0600; a directory another user owns or others can write to is refused;
* a filesystem fault (read-only or full disk, permission denied, a file in the way) never fails
  a compile: the cache degrades to "not written" or "not used" with one warning;
* writes go to a temporary file then ``os.replace`` (atomic), so two processes compiling the
  same model at once leave one valid entry.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

from .. import metrics

__all__ = ["DiskCache", "disk_cache", "cache_key", "versions", "CacheDirError", "make_private_dir"]

logger = logging.getLogger("ort_lazy")
_FORMAT = 5  # raised whenever translations change under one version: old entries are not reused


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """The versions every key depends on."""
    import torch

    from .._version import __version__
    from .flavour import flavour, onnxruntime

    return {
        "format": str(_FORMAT),
        "ort_lazy": __version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime().__version__,
        "flavour": flavour(),
    }


def cache_key(*parts: Any) -> str:
    """SHA-256 over ``parts`` (JSON-encoded) and :func:`versions`."""
    payload = json.dumps([versions(), *parts], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


class CacheDirError(RuntimeError):
    """The cache directory is not safe to use."""


def make_private_dir(root: str | os.PathLike[str]) -> Path:
    """``root`` made (0700; missing parents too) if missing, and checked as the compile cache's folder
    is: a directory of this user's that others cannot write to. Returns it.

    Raises:
        CacheDirError: it cannot be made, is not a directory, or is not safe to use.
    """
    path = Path(root).expanduser()
    DiskCache._make_private_dir(path)
    return path


class DiskCache:
    """Verified, atomic, private on-disk storage of ONNX models and small JSON documents.

    Never raises for a filesystem fault once made: a read fault is a miss, a write fault turns
    writing off (both warned about once per directory).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()
        self._lock = threading.Lock()
        self._make_private_dir(self.root)
        #: False once a write failed (read-only or full disk): entries are only read
        self.writable = True
        #: False once reading failed (permission denied): the cache is not used at all
        self.readable = True

    @staticmethod
    def _make_private_dir(root: Path) -> None:
        try:
            root.mkdir(mode=0o700, parents=True)
            created = True
        except FileExistsError:
            created = False
        except OSError as e:
            raise CacheDirError(f"cannot create the cache directory {root}: {e.strerror or e}") from None
        if not root.is_dir():
            raise CacheDirError(f"the cache directory {root} exists but is not a directory (a file is in the way)")
        st = root.stat()
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise CacheDirError(f"cache directory {root} belongs to another user")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CacheDirError(f"cache directory {root} is writable by other users; use a private directory")
        if created and st.st_mode & 0o077:
            os.chmod(root, 0o700)  # only one we made: an existing directory keeps its permissions

    def _no_write(self, error: BaseException) -> None:
        """Stop writing to this cache after a write fault (warned once per directory)."""
        self.writable = False
        metrics.warn_once(
            f"diskw:{self.root}",
            "ort-lazy: cannot write the compile cache in %s (%s); it is only read from now on",
            self.root,
            error,
        )

    def _read_fault(self, error: BaseException) -> None:
        """Stop using this cache after a read fault (warned once per directory)."""
        self.readable = self.writable = False
        metrics.increment("disk_cache_misses")
        metrics.warn_once(f"diskr:{self.root}", "ort-lazy: cannot read the compile cache in %s (%s); compiling without it", self.root, error)

    def _remove(self, *paths: Path) -> None:
        """Delete a rejected entry's files; a fault leaves them (and stops writing)."""
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                self._no_write(e)

    # -- ONNX models ---------------------------------------------------------------------------
    def get_model(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The verified (model bytes, metadata) stored under ``key``, or None."""
        meta_path, blob_path = self.root / f"{key}.json", self.root / f"{key}.onnx"
        if not self.readable:
            metrics.increment("disk_cache_misses")
            return None
        try:
            if not meta_path.exists():
                metrics.increment("disk_cache_misses")
                return None
            meta = json.loads(meta_path.read_text())
            blob = blob_path.read_bytes()
            if meta.get("key") != key or meta.get("versions") != versions():
                raise ValueError("entry written for another key or version")
            if len(blob) != meta["size"] or hashlib.sha256(blob).hexdigest() != meta["sha256"]:
                raise ValueError("payload does not match its recorded hash (tampered or truncated)")
        except PermissionError as e:
            self._read_fault(e)
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            metrics.increment("disk_cache_rejected")
            metrics.warn_once(f"disk:{key}", "ort-lazy: rejected cache entry %s (%s); rebuilding it", key[:16], e)
            self._remove(meta_path, blob_path)
            return None
        metrics.increment("disk_cache_hits")
        return blob, meta["data"]

    def put_model(self, key: str, blob: bytes, data: dict[str, Any]) -> None:
        """Store ``blob`` and its JSON ``data`` under ``key`` (payload first, metadata last)."""
        if not self.writable:
            return
        meta = {
            "key": key,
            "versions": versions(),
            "size": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
            "data": data,
        }
        try:
            self._write(self.root / f"{key}.onnx", blob)
            self._write(self.root / f"{key}.json", json.dumps(meta).encode())
        except OSError as e:
            self._no_write(e)

    # -- small JSON documents (the support table's answers) ------------------------------------
    def get_json(self, name: str) -> Any:
        """A JSON document written by :meth:`put_json` for the current versions, or None."""
        path = self.root / f"{name}-{cache_key(name)[:16]}.doc.json"
        if not self.readable:
            return None
        try:
            doc = json.loads(path.read_text())
            body = json.dumps(doc["body"], sort_keys=True)
            if hashlib.sha256(body.encode()).hexdigest() != doc["sha256"]:
                raise ValueError("document does not match its recorded hash")
            return doc["body"]
        except FileNotFoundError:
            return None
        except PermissionError as e:
            self._read_fault(e)
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            metrics.increment("disk_cache_rejected")
            metrics.warn_once(f"doc:{path}", "ort-lazy: rejected cache document %s (%s)", path.name, e)
            self._remove(path)
            return None

    def put_json(self, name: str, body: Any) -> None:
        """Store a JSON-serialisable ``body`` under ``name`` for the current versions."""
        if not self.writable:
            return
        path = self.root / f"{name}-{cache_key(name)[:16]}.doc.json"
        text = json.dumps(body, sort_keys=True)
        doc = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "body": body}
        try:
            self._write(path, json.dumps(doc).encode())
        except OSError as e:
            self._no_write(e)

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(tmp).unlink(missing_ok=True)
            raise


_caches: dict[str, DiskCache | None] = {}
_caches_lock = threading.Lock()


def disk_cache(root: str | None) -> DiskCache | None:
    """The :class:`DiskCache` for ``root`` (shared per directory); None when unset or unsafe."""
    if not root:
        return None
    with _caches_lock:
        if root not in _caches:
            try:
                _caches[root] = DiskCache(root)
            except (OSError, CacheDirError) as e:
                text = str(e) if isinstance(e, CacheDirError) else f"cannot use the cache directory {root}: {e.strerror or e}"
                logger.warning("ort-lazy: compile cache disabled (compiling without it): %s", text)
                _caches[root] = None
        return _caches[root]

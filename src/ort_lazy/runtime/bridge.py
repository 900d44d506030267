"""The compiled TorchScript bridge (``ort_lazy._bridge``): loading, version check, on/off state.

The bridge registers a TorchScript post pass that fuses ORT-supported nodes into
``ort::CompilationGroup`` nodes and an operator that runs such a node through a Python runner.
It serves two users, TorchScript (``ort_lazy.jit``) and LazyTensor (``ort_lazy.lazy``); the pass
is on while either needs it, with the options given last.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..options import Options

__all__ = [
    "BridgeUnavailableError",
    "bridge_info",
    "load_bridge",
    "no_fusion",
    "activate",
    "deactivate",
    "users",
    "options",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_BUILD_INFO = _PACKAGE_DIR / "_bridge_build.json"
_BUILD_HINT = (
    "build it with `python build.py --enable_lazy_tensor` (or, with torch installed, "
    "`pip install --no-build-isolation .` from the source tree)"
)


class BridgeUnavailableError(ImportError, RuntimeError):
    """The compiled bridge is missing or was built against another torch."""


_lock = threading.RLock()
_bridge: ModuleType | None = None
_installer: Callable[[ModuleType], None] | None = None
_options: Options | None = None
_users: set[str] = set()
#: called with no arguments whenever the options in effect change
_on_change: list[Callable[[], None]] = []


def bridge_info() -> dict[str, Any] | None:
    """What ``_bridge_build.json`` records about the built bridge, or None if not built."""
    try:
        return json.loads(_BUILD_INFO.read_text())
    except (OSError, ValueError):
        return None


def set_installer(installer: Callable[[ModuleType], None]) -> None:
    """Register what to do with the module once loaded (install the Python callbacks); applied
    at once when it is loaded already."""
    global _installer
    with _lock:
        _installer = installer
        if _bridge is not None:
            installer(_bridge)


def load_bridge() -> ModuleType:
    """Import ``ort_lazy._bridge`` after checking it matches the running torch.

    Raises:
        BridgeUnavailableError: not built, or built against another torch (both versions
            and the rebuild command are named).
    """
    global _bridge
    if _bridge is not None:
        return _bridge
    with _lock:
        if _bridge is not None:
            return _bridge
        info = bridge_info()
        libs = [p for p in _PACKAGE_DIR.glob("_bridge.*") if p.suffix in (".so", ".pyd")]
        if info is None or not libs:
            raise BridgeUnavailableError(
                f"the ort-lazy LazyTensor/TorchScript bridge is not built in {_PACKAGE_DIR}; {_BUILD_HINT}"
            )
        built = info.get("torch_version")
        if built != torch.__version__:
            raise BridgeUnavailableError(
                f"the ort-lazy bridge was built against torch {built} but torch {torch.__version__} "
                f"is installed; rebuild it with `python build.py --enable_lazy_tensor`"
            )
        try:
            module = importlib.import_module("ort_lazy._bridge")
        except ImportError as e:
            raise BridgeUnavailableError(f"the ort-lazy bridge failed to load ({e}); {_BUILD_HINT}") from e
        if _installer is not None:
            _installer(module)
        _bridge = module
        return module


@contextlib.contextmanager
def no_fusion() -> Iterator[None]:
    """Suspend the fusion pass on this thread (while a group is exported or run for reference)."""
    bridge = load_bridge()
    bridge.push_pass_disabled()
    try:
        yield
    finally:
        bridge.pop_pass_disabled()


def activate(user: str, options: Options) -> None:
    """Turn the pass on for ``user`` (``"jit"`` or ``"lazy"``) with ``options``."""
    global _options
    bridge = load_bridge()
    with _lock:
        changed = _options != options
        _options = options
        _users.add(user)
        bridge.set_enabled(True)
    if changed:
        for callback in _on_change:
            callback()


def deactivate(user: str) -> None:
    """Turn the pass off for ``user``; it stays on while another user needs it."""
    with _lock:
        _users.discard(user)
        if _bridge is not None:
            _bridge.set_enabled(bool(_users))


def users() -> frozenset[str]:
    """Who has the pass on now (``jit``, ``lazy``)."""
    with _lock:
        return frozenset(_users)


def options() -> Options | None:
    """The options groups are compiled with now (None when never activated)."""
    return _options


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever :func:`activate` changes the options in effect."""
    _on_change.append(callback)

"""Reentry guards for decompositions that call the op they decompose.

A decomposition table entry is applied to every call of its op while a graph is traced, also to
the calls the decomposition itself makes; :func:`_once` lets the inner call through as is.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["_once"]

_reentry = threading.local()


def _active() -> set[Any]:
    """The ops this thread is decomposing now."""
    active = getattr(_reentry, "ops", None)
    if active is None:
        active = _reentry.ops = set()
    return active


def _once(op: Any, decompose: Any) -> Any:
    """``decompose`` for ``op`` that may call ``op`` itself: inside it, ``op`` is traced as is
    (a decomposition table entry returning NotImplemented)."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        active = _active()
        if op in active:
            return NotImplemented
        active.add(op)
        try:
            return decompose(*args, **kwargs)
        finally:
            active.discard(op)

    guarded.__doc__ = decompose.__doc__
    return guarded

"""The process-wide cache of ORT sessions: a bounded LRU, safe to use from many threads, whose
entries end with the tensors their sessions read initializers from. Its sessions (and their thread
pools) are released at exit, while the interpreter is still whole.
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import torch

from .. import metrics

__all__ = ["SessionCache", "session_cache"]


class SessionCache:
    """A bounded LRU of ORT sessions, safe to use from many threads.

    An entry can depend on tensors the cache holds no reference to (a session reading its
    initializers from their memory): :meth:`drop_with` ends the entry when one of them dies, so
    no later tensor that happens to get the same address is mistaken for it.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}
        # keys whose tensors died; appended by finalizers (any thread, maybe inside a locked
        # section of this one: so no lock there), removed before every lookup
        self._dead: collections.deque[Hashable] = collections.deque()

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            self._purge()
            return key in self._items

    def drop_with(self, key: Hashable, tensors: Iterable[torch.Tensor]) -> None:
        """Forget ``key``'s entry as soon as any of ``tensors`` is freed."""
        for t in tensors:
            weakref.finalize(t, self._dead.append, key)

    def _purge(self) -> None:
        while self._dead:
            self._items.pop(self._dead.popleft(), None)

    def get_or_create(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """The cached value for ``key``, or ``factory()`` stored under it (built once)."""
        with self._lock:
            self._purge()
            if key in self._items:
                self._items.move_to_end(key)
                metrics.increment("session_cache_hits")
                return self._items[key]
            build_lock = self._building.setdefault(key, threading.Lock())
        with build_lock:
            with self._lock:
                self._purge()
                if key in self._items:
                    self._items.move_to_end(key)
                    metrics.increment("session_cache_hits")
                    return self._items[key]
            value = factory()
            with self._lock:
                self._items[key] = value
                self._items.move_to_end(key)
                while len(self._items) > self.capacity:
                    self._items.popitem(last=False)
                self._building.pop(key, None)
            return value

    def values(self) -> list[Any]:
        """The cached entries, least recently used first."""
        with self._lock:
            self._purge()
            return list(self._items.values())

    def discard(self, key: Hashable) -> None:
        """Drop ``key``'s entry, if any (runners holding its session keep it)."""
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        """Drop every session."""
        with self._lock:
            self._items.clear()


_cache = SessionCache()
# ORT sessions (and their thread pools) are released while the interpreter is still whole,
# not during its teardown
atexit.register(_cache.clear)


def session_cache(capacity: int | None = None) -> SessionCache:
    """The process-wide session cache (``capacity`` updates its bound)."""
    if capacity is not None:
        _cache.capacity = capacity
    return _cache

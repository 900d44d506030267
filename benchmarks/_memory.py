"""Memory of a row, read from the resident set size (RSS).

Peak memory (``peak MiB``) is measured from the RSS: ``retained``, the RSS growth from just
before a row is built to just after its warm-up (its model copy, compiled code, ORT sessions and
arenas), plus ``call peak``, the peak RSS above the RSS just before 3 steady-state calls
(sampled every 0.2 ms from ``/proc/self/statm``). Every reading follows a ``gc.collect()`` and
``malloc_trim(0)``, so freed heap is not counted. tracemalloc is not used: it cannot see
PyTorch's or ORT's native allocations.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["Rss"]


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return 4096


class Rss:
    """Reads this process's resident set size (Linux ``/proc/self/statm``; else unavailable)."""

    def __init__(self) -> None:
        self._page = _page_size()
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
        try:
            self._trim: Any = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None

    @property
    def available(self) -> bool:
        """Whether RSS can be read here."""
        return self._fd is not None

    def read(self) -> int:
        """Resident bytes now."""
        assert self._fd is not None
        fields = os.pread(self._fd, 128, 0).split()
        return int(fields[1]) * self._page

    def settle(self) -> int:
        """Collect garbage, give freed heap back to the OS, and return the RSS after that."""
        gc.collect()
        if self._trim is not None:
            self._trim(0)
        return self.read()

    @contextlib.contextmanager
    def peak(self, interval_s: float = 0.0002) -> Iterator[list[int]]:
        """Sample RSS in a thread while the body runs; yields a list that gets ``[peak]``."""
        result: list[int] = []
        stop = threading.Event()
        samples = [self.read()]

        def sample() -> None:
            best = samples[0]
            while not stop.is_set():
                best = max(best, self.read())
                time.sleep(interval_s)
            samples.append(best)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield result
        finally:
            stop.set()
            thread.join()
            result.append(max(max(samples), self.read()))


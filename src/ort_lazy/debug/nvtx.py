"""NVTX ranges around export, session creation and ORT runs (the ``nvtx`` option).

With ``ORT_LAZY_NVTX=1`` a profiler such as Nsight Systems shows ``ort_lazy.export:<region>``,
``ort_lazy.session:<region>`` and ``ort_lazy.run:<region>`` ranges on the timeline. NVTX comes
with CUDA builds of torch; on a build without it the option warns once and does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from .. import metrics

__all__ = ["nvtx_range", "available"]

_functions: tuple[Callable[[str], object], Callable[[], object]] | None = None
_checked = False


def available() -> bool:
    """Whether torch can emit NVTX ranges in this process (checked once)."""
    global _functions, _checked
    if not _checked:
        _checked = True
        try:
            import torch.cuda.nvtx as nvtx

            nvtx.range_push("ort_lazy.nvtx-check")
            nvtx.range_pop()
            _functions = (nvtx.range_push, nvtx.range_pop)
        except Exception as e:  # CPU builds: "NVTX functions not installed"
            metrics.warn_once("nvtx", "ort-lazy: the nvtx option needs a torch build with NVTX (CUDA): %s", e)
    return _functions is not None


@contextlib.contextmanager
def nvtx_range(name: str, enabled: bool) -> Iterator[None]:
    """An NVTX range named ``name`` around the body when ``enabled`` (and NVTX is available)."""
    if not enabled or not available():
        yield
        return
    assert _functions is not None
    push, pop = _functions
    push(name)
    try:
        yield
    finally:
        pop()

"""The ``debug`` run type: run each ORT region and its PyTorch twin, compare, time both."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from .. import metrics
from ..options import Options

__all__ = ["MismatchError", "compare_region", "compare_outputs"]


class MismatchError(AssertionError):
    """ORT and PyTorch disagree on a region's output."""


def compare_outputs(name: str, expected: Sequence[Any], actual: Sequence[Any], rtol: float, atol: float) -> None:
    """Raise :class:`MismatchError` naming ``name`` and the worst element when outputs differ."""
    if len(expected) != len(actual):
        raise MismatchError(f"{name}: PyTorch gave {len(expected)} outputs, ORT {len(actual)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        if not isinstance(e, torch.Tensor):
            continue
        where = f"{name} output {i}"
        if not isinstance(a, torch.Tensor):
            raise MismatchError(f"{where}: ORT gave {type(a).__name__}, PyTorch a tensor")
        if e.dtype != a.dtype:
            raise MismatchError(f"{where}: dtype {a.dtype} on ORT, {e.dtype} in PyTorch")
        if tuple(e.shape) != tuple(a.shape):
            raise MismatchError(f"{where}: shape {tuple(a.shape)} on ORT, {tuple(e.shape)} in PyTorch")
        if e.device != a.device:
            raise MismatchError(f"{where}: device {a.device} on ORT, {e.device} in PyTorch")
        if e.numel() == 0:
            continue
        ef, af = e.detach().to(torch.float64), a.detach().to(torch.float64)
        close = torch.isclose(af, ef, rtol=rtol, atol=atol, equal_nan=True)
        if not bool(close.all()):
            diff = (af - ef).abs().nan_to_num(float("inf"))
            diff[close] = 0
            flat = int(diff.reshape(-1).argmax())
            index = tuple(int(x) for x in torch.unravel_index(torch.tensor(flat), e.shape)) if e.dim() else ()
            raise MismatchError(
                f"{where}: mismatch at {index}: ORT {af.reshape(-1)[flat].item()!r} vs PyTorch "
                f"{ef.reshape(-1)[flat].item()!r} (rtol={rtol}, atol={atol}); "
                f"{int((~close).sum())} of {e.numel()} elements differ"
            )


def compare_region(name: str, torch_module: Any, args: Sequence[Any], ort_outputs: Sequence[Any], options: Options) -> None:
    """Run ``torch_module`` on ``args`` and compare with ``ort_outputs``; time the PyTorch run."""
    start = time.perf_counter()
    expected = torch_module(*args)
    metrics.record_time(f"debug_torch:{name}", time.perf_counter() - start)
    if not isinstance(expected, (tuple, list)):
        expected = [expected]
    compare_outputs(name, list(expected), list(ort_outputs), options.rtol, options.atol)

"""The ``debug`` run type: run each ORT region and its PyTorch twin, compare, time both."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import metrics
from ..options import Options

__all__ = ["ARBITER_FACTOR", "MismatchError", "compare_region", "compare_outputs", "widened"]


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


#: a float32/float16/bfloat16 output beyond the tolerance still matches when, measured against
#: the twin run in float64, ORT's largest error is at most this many times PyTorch's own: the
#: computation is ill-conditioned there (batch-norm statistics over a batch of two), and eager
#: is no closer to the exact result than ORT
ARBITER_FACTOR = 4.0

_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def widened(value: Any) -> Any:
    """A float32/float16/bfloat16 tensor as float64; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dtype in _NARROW:
        return value.detach().to(torch.float64)
    return value


def _as_exact_as_pytorch(
    exact_run: Callable[[], Any], expected: Sequence[Any], actual: Sequence[Any], rtol: float, atol: float
) -> bool:
    """Whether each float32/half output of ORT is about as close to the twin's float64 result
    (``exact_run()``) as PyTorch's (:data:`ARBITER_FACTOR`) or within ``rtol`` of that output's
    largest exact magnitude (an element far smaller than the rest, such as one channel's
    batch-norm statistic over a batch of two), and every other output within ``rtol``/``atol``
    of PyTorch's; False when the twin cannot run in float64."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, torch.Tensor) and e.dtype in _NARROW:
            if not isinstance(a, torch.Tensor) or (a.dtype, a.shape, a.device) != (e.dtype, e.shape, e.device):
                return False
            continue
        try:  # integers, booleans, float64: no arbiter
            compare_outputs(f"output {i}", [e], [a], rtol, atol)
        except MismatchError:
            return False
    try:
        exact = exact_run()
    except Exception:  # a graph that fixes its dtypes: no arbiter
        return False
    exact = list(exact) if isinstance(exact, (tuple, list)) else [exact]
    if len(exact) != len(expected):
        return False
    for e, a, x in zip(expected, actual, exact):
        if not isinstance(e, torch.Tensor) or e.dtype not in _NARROW or e.numel() == 0:
            continue
        if not isinstance(x, torch.Tensor) or x.shape != e.shape:
            return False
        x = x.detach().to(torch.float64)
        ort_error = (a.detach().to(torch.float64) - x).abs().nan_to_num(float("inf")).max()
        torch_error = (e.detach().to(torch.float64) - x).abs().nan_to_num(float("inf")).max()
        scale = x.abs().nan_to_num(0.0).max()  # the output's largest exact magnitude
        if not bool(ort_error <= ARBITER_FACTOR * torch_error or ort_error <= rtol * scale + atol):
            return False
    return True


def compare_region(
    name: str,
    reference: Callable[[Sequence[Any]], Any],
    args: Sequence[Any],
    ort_outputs: Sequence[Any],
    options: Options,
    exact_run: Callable[[], Any] | None = None,
) -> None:
    """Run ``reference`` (a region's PyTorch twin) on ``args``, time it, and raise
    :class:`MismatchError` when ``ort_outputs`` differ beyond ``options.rtol``/``atol``, unless
    ORT is about as close as PyTorch to the twin's float64 result (``exact_run()``, by default
    ``reference`` on ``args`` widened; :data:`ARBITER_FACTOR`)."""
    start = time.perf_counter()
    expected = reference(args)
    metrics.record_time(f"debug_torch:{name}", time.perf_counter() - start)
    if not isinstance(expected, (tuple, list)):
        expected = [expected]
    try:
        compare_outputs(name, list(expected), list(ort_outputs), options.rtol, options.atol)
    except MismatchError:
        if exact_run is None:

            def exact_run() -> Any:
                return reference([widened(a) for a in args])

        if not _as_exact_as_pytorch(exact_run, expected, ort_outputs, options.rtol, options.atol):
            raise
        metrics.increment("debug_ill_conditioned")

"""The ``debug`` run type: run each ORT region and its PyTorch twin, compare, time both."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import metrics
from ..options import Options

__all__ = ["ARBITER_FACTOR", "JITTER_RUNS", "MismatchError", "compare_region", "compare_outputs", "widened"]


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
#: the twin run in float64, ORT's largest error is at most this many times PyTorch's own or the
#: output's sensitivity to its inputs' rounding: the computation is ill-conditioned there
#: (batch-norm statistics over a batch of two), and float32 cannot tell the exact result closer
ARBITER_FACTOR = 4.0

_NARROW = (torch.float32, torch.float16, torch.bfloat16)


#: how many runs of the float64 twin on jittered inputs estimate how far an output moves when
#: its inputs move by their dtype's rounding (:func:`_sensitivity`)
JITTER_RUNS = 2


def widened(value: Any, jitter: torch.Generator | None = None) -> Any:
    """A float32/float16/bfloat16 tensor as float64, each element moved by a random relative
    amount of the size of its dtype's rounding (normal, standard deviation ``eps``) when a
    ``jitter`` generator is given; anything else as it is."""
    if not isinstance(value, torch.Tensor) or value.dtype not in _NARROW:
        return value
    wide = value.detach().to(torch.float64)
    if jitter is None or wide.numel() == 0:
        return wide
    noise = torch.randn(wide.shape, generator=jitter, dtype=torch.float64).to(wide.device)
    return wide * (1 + torch.finfo(value.dtype).eps * noise)


def _sensitivity(exact_run: Callable[..., Any], exact: Sequence[Any]) -> list[float] | None:
    """Per output, the largest change of the float64 result when the inputs move by their
    dtype's rounding (:func:`widened` with a generator of fixed seed, :data:`JITTER_RUNS`
    runs): how far any float32 computation of an ill-conditioned output may land from the
    exact one; None when the twin cannot run so."""
    generator = torch.Generator().manual_seed(0)
    moved = [0.0] * len(exact)
    for _ in range(JITTER_RUNS):
        try:
            jittered = exact_run(generator)
        except Exception:
            return None
        jittered = list(jittered) if isinstance(jittered, (tuple, list)) else [jittered]
        if len(jittered) != len(exact):
            return None
        for i, (x, j) in enumerate(zip(exact, jittered)):
            if isinstance(x, torch.Tensor) and isinstance(j, torch.Tensor) and x.shape == j.shape and x.numel():
                change = (j.detach().to(torch.float64) - x.detach().to(torch.float64)).abs().nan_to_num(0.0).max()
                moved[i] = max(moved[i], float(change))
    return moved


def _as_exact_as_pytorch(
    exact_run: Callable[..., Any], expected: Sequence[Any], actual: Sequence[Any], rtol: float, atol: float
) -> bool:
    """Whether each float32/half output of ORT is about as close to the twin's float64 result
    (``exact_run()``) as float32 can tell, and every other output within ``rtol``/``atol`` of
    PyTorch's; False when the twin cannot run in float64. ORT's largest error may be
    :data:`ARBITER_FACTOR` times PyTorch's or times the output's :func:`_sensitivity` (how far
    the exact result moves when the inputs move by their rounding: ``exact_run(generator)``;
    LeViT's ``rsqrt`` of a batch variance near 0 moves by 1-2 where its value is 313), or within
    ``rtol`` of the output's largest exact magnitude (an element far smaller than the rest, such
    as one channel's batch-norm statistic over a batch of two)."""
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
    sensitivity: list[float] | None = None
    for i, (e, a, x) in enumerate(zip(expected, actual, exact)):
        if not isinstance(e, torch.Tensor) or e.dtype not in _NARROW or e.numel() == 0:
            continue
        if not isinstance(x, torch.Tensor) or x.shape != e.shape:
            return False
        x = x.detach().to(torch.float64)
        ort_error = float((a.detach().to(torch.float64) - x).abs().nan_to_num(float("inf")).max())
        torch_error = float((e.detach().to(torch.float64) - x).abs().nan_to_num(float("inf")).max())
        scale = float(x.abs().nan_to_num(0.0).max())  # the output's largest exact magnitude
        if ort_error <= ARBITER_FACTOR * torch_error or ort_error <= rtol * scale + atol:
            continue
        if sensitivity is None:
            sensitivity = _sensitivity(exact_run, exact)
        if sensitivity is None or not ort_error <= ARBITER_FACTOR * sensitivity[i]:
            return False
    return True


def compare_region(
    name: str,
    reference: Callable[[Sequence[Any]], Any],
    args: Sequence[Any],
    ort_outputs: Sequence[Any],
    options: Options,
    exact_run: Callable[..., Any] | None = None,
) -> None:
    """Run ``reference`` (a region's PyTorch twin) on ``args``, time it, and raise
    :class:`MismatchError` when ``ort_outputs`` differ beyond ``options.rtol``/``atol``, unless
    ORT is about as close to the twin's float64 result as float32 can tell (``exact_run(jitter)``,
    by default ``reference`` on ``args`` :func:`widened`; :func:`_as_exact_as_pytorch`)."""
    start = time.perf_counter()
    expected = reference(args)
    metrics.record_time(f"debug_torch:{name}", time.perf_counter() - start)
    if not isinstance(expected, (tuple, list)):
        expected = [expected]
    try:
        compare_outputs(name, list(expected), list(ort_outputs), options.rtol, options.atol)
    except MismatchError:
        if exact_run is None:

            def exact_run(jitter: torch.Generator | None = None) -> Any:
                return reference([widened(a, jitter) for a in args])

        if not _as_exact_as_pytorch(exact_run, expected, ort_outputs, options.rtol, options.atol):
            raise
        metrics.increment("debug_ill_conditioned")

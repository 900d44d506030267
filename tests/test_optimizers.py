"""Compiled optimizer steps: ``torch.compile(optimizer.step, backend="ort")`` updates the
parameters and the optimizer's state exactly as the eager step does, for every optimizer of
``torch.optim``: on ORT (``torch_preferred_ops=()``), and in PyTorch by default.

Dynamo holds an optimizer's parameters and state as attributes of the graph (``get_attr``), not
as inputs, and writes ``addcmul_``/``addcdiv_`` with a ``value`` as a fused multiply-add: the
class of graph these tests cover (an in-place update of an attribute ran for real while the
no-grad lowering traced the graph: Adam's step count went up twice on the first step).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from helpers import assert_close, assert_ran_on_ort, tiered
from ort_lazy import metrics

OPTIMIZERS: dict[str, Any] = {
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.05, **k),
    "sgd-momentum": lambda p, **k: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, **k),
    "adam": lambda p, **k: torch.optim.Adam(p, lr=0.01, **k),
    "adam-amsgrad": lambda p, **k: torch.optim.Adam(p, lr=0.01, amsgrad=True, weight_decay=0.01, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=0.01, **k),
    "adamax": lambda p, **k: torch.optim.Adamax(p, lr=0.01, **k),
    "nadam": lambda p, **k: torch.optim.NAdam(p, lr=0.01, **k),
    "radam": lambda p, **k: torch.optim.RAdam(p, lr=0.01, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.05, **k),
    "adadelta": lambda p, **k: torch.optim.Adadelta(p, lr=0.5, **k),
    "rmsprop": lambda p, **k: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, **k),
    "asgd": lambda p, **k: torch.optim.ASGD(p, lr=0.01, **k),
    "rprop": lambda p, **k: torch.optim.Rprop(p, lr=0.01, **k),
}

#: the optimizers also checked in their multi-tensor (``foreach``) form
FOREACH = ("sgd-momentum", "adam", "adamw", "rmsprop")

#: a step's graph only updates state in place: by default it stays in PyTorch (faster there),
#: with these options it runs on ORT
ON_ORT = {"torch_preferred_ops": ()}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _step_both(runs: tuple[tuple[torch.nn.Module, torch.optim.Optimizer, Any], ...], x: torch.Tensor) -> None:
    """One training step of each (model, optimizer, step function) on ``x``."""
    for model, opt, run in runs:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        run()


def _state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for _, v in sorted(s.items()) if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize(
    "name,foreach",
    tiered(
        [(n, False) for n in OPTIMIZERS] + [(n, True) for n in FOREACH],
        [("sgd-momentum", False), ("adam", False), ("adagrad", False), ("adam", True)],  # the default run's
        unpack=True,
    ),
    ids=lambda v: v if isinstance(v, str) else ("foreach" if v else "for-loop"),
)
def test_compiled_step_matches_eager(name, foreach):
    ref = _model()
    mine = copy.deepcopy(ref)
    make = OPTIMIZERS[name]
    opt_ref, opt_mine = make(ref.parameters(), foreach=foreach), make(mine.parameters(), foreach=foreach)
    torch._dynamo.reset()
    metrics.reset()
    step = torch.compile(opt_mine.step, backend="ort", options=ON_ORT)
    torch.manual_seed(1)
    for _ in range(3):
        _step_both(((ref, opt_ref, opt_ref.step), (mine, opt_mine, step)), torch.randn(5, 8))
        for a, b in zip(mine.parameters(), ref.parameters()):
            assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
        mine_state, ref_state = _state(opt_mine), _state(opt_ref)
        assert len(mine_state) == len(ref_state)
        for a, b in zip(mine_state, ref_state):
            assert_close(a, b, rtol=1e-5, atol=1e-6)
    c = assert_ran_on_ort()
    assert c["export_failures"] == c["ort_failures"] == c["compile_failures"] == 0, c


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
def test_step_stays_in_pytorch_by_default(foreach):
    """With the default options a step runs as dynamo captured it (PyTorch's in-place kernels),
    counted as preferred in PyTorch: eager's values, no ORT run."""
    from ort_lazy.reasons import Reason

    ref = _model()
    mine = copy.deepcopy(ref)
    opt_ref, opt_mine = (torch.optim.Adam(m.parameters(), lr=0.01, foreach=foreach) for m in (ref, mine))
    torch._dynamo.reset()
    metrics.reset()
    step = torch.compile(opt_mine.step, backend="ort")
    for _ in range(2):
        _step_both(((ref, opt_ref, opt_ref.step), (mine, opt_mine, step)), torch.randn(5, 8))
    for a, b in zip(mine.parameters(), ref.parameters()):
        # within rounding: dynamo writes addcdiv_ as a division and a fused multiply-add
        assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    c = metrics.counters()
    assert c["ort_runs"] == 0 and c["fallback_ops"] > 0, c
    reasons = {r for per_op in metrics.fallbacks().values() for r in per_op}
    assert reasons == {Reason.PREFERRED}, metrics.fallbacks()


def test_fused_multiply_add_runs_on_ort():
    """dynamo writes ``addcmul_``/``addcdiv_`` with a ``value`` as ``prims.fma``: one region."""

    def f(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        acc = acc.clone()
        acc.addcmul_(a, b, value=0.25).addcdiv_(a, b.abs() + 1, value=-2.0)
        return acc

    torch._dynamo.reset()
    metrics.reset()
    args = [torch.randn(4, 5) for _ in range(3)]
    assert_close(torch.compile(f, backend="ort")(*args), f(*args))
    c = assert_ran_on_ort()
    assert c["fallback_ops"] == 0, c

"""Batch norm in training: eager's outputs, statistics and running statistics, in 6 passes on ORT."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers import (
    assert_close,
    assert_ran_on_ort,
    captured_exports,
    compile_ort,
    full_size_nodes,
    torch_decomposition_of,
)
from ort_lazy import metrics
from ort_lazy.lowering import normalization

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 5), (2, 4, 5, 3), (2, 4, 3, 2, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_rewrite_gives_the_ops_five_results(dtype, shape, affine) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3 + 1
    c = shape[1]
    weight, bias = (torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype)) if affine else (None, None)
    mean, var = torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5
    args = (x, weight, bias, mean, var, True, 0.1, 1e-5)
    got = normalization.batch_norm_training(*args)
    expected = aten._native_batch_norm_legit_functional(*args)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert_close(g, e, rtol=1e-5, atol=1e-5)


def _model(kind: str, affine: bool, momentum: float) -> tuple[nn.Module, torch.Tensor]:
    make, shape = {
        "1d": (nn.BatchNorm1d, (8, 6)),
        "1d-seq": (nn.BatchNorm1d, (4, 6, 5)),
        "2d": (nn.BatchNorm2d, (4, 6, 5, 5)),
        "3d": (nn.BatchNorm3d, (2, 6, 3, 4, 4)),
    }[kind]
    conv = nn.Linear(shape[-1], shape[-1])
    return nn.Sequential(conv, make(6, affine=affine, momentum=momentum), nn.ReLU()), torch.randn(shape) * 2 + 0.5


@pytest.mark.parametrize("kind", ["1d", "1d-seq", "2d", "3d"])
@pytest.mark.parametrize(("affine", "momentum"), [(True, 0.1), (False, 0.3)])
def test_training_matches_eager_with_running_statistics(kind, affine, momentum) -> None:
    """Outputs, gradients, updated weights and every buffer (running mean and variance, the batch
    count) follow eager over three steps; ORT ran."""
    torch.manual_seed(0)
    reference, x = _model(kind, affine, momentum)
    model = copy.deepcopy(reference)
    compiled = compile_ort(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (reference, model)]
    metrics.reset()
    for _ in range(3):
        outs = []
        for fn, opt in zip((reference, compiled), optimizers):
            opt.zero_grad()
            out = fn(x)
            out.square().mean().backward()
            opt.step()
            outs.append(out.detach())
        assert_close(outs[1], outs[0])
    assert_ran_on_ort(2)
    for got, expected in zip(model.state_dict().values(), reference.state_dict().values(), strict=True):
        assert_close(got, expected, rtol=1e-4, atol=1e-5)


def _forward_passes() -> list[str]:
    x = torch.randn(4, 6, 5, 5)
    with captured_exports() as models:
        compile_ort(nn.BatchNorm2d(6))(x).sum().backward()
    forward = next(m for m in models if m.name.startswith("forward"))
    return full_size_nodes(forward.model_bytes, x.numel())


def test_training_forward_writes_four_full_size_tensors() -> None:
    """Deviation, its square, ``x * scale`` and ``+ shift``; the two means read without writing."""
    assert sorted(_forward_passes()) == ["Add", "Mul", "Mul", "Sub"]


def test_pass_count_check_sees_torchs_decomposition() -> None:
    """The check above can fail: torch's own decomposition writes more full-size tensors."""
    with torch_decomposition_of(aten._native_batch_norm_legit_functional.default):
        assert len(_forward_passes()) > 4


@pytest.mark.parametrize("kind", ["1d", "2d", "3d"])
def test_gradients_in_eval_mode_run_on_ort(kind) -> None:
    """Gradients through eval-mode (frozen) batch norm, with the default options: the saved
    statistics of ``_native_batch_norm_legit_no_training`` are empty in eager, and a region that
    gave them per-channel values failed its shape check and ran in PyTorch."""
    torch.manual_seed(0)
    reference, x = _model(kind, True, 0.1)
    reference.eval()
    model = copy.deepcopy(reference)
    metrics.reset()
    compiled = compile_ort(model)  # defaults: batch norm's gradient in PyTorch reads the saved statistics
    for fn in (reference, compiled):
        fn(x).square().mean().backward()
    for got, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert_close(got.grad, expected.grad)
    for got, expected in zip(model.buffers(), reference.buffers(), strict=True):
        assert torch.equal(got, expected)
    c = assert_ran_on_ort(2)
    assert c["export_failures"] == c["fallback_regions"] == 0, c

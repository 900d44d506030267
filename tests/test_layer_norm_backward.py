"""Layer norm's gradient on the CPU: eager's values in 8 full-size writes, its row sums as
matrix-vector products with the weight (lowering/normalization.py, ``layer_norm_backward``)."""

from __future__ import annotations

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
    train_parity,
)
from ort_lazy import metrics
from ort_lazy.lowering import normalization

aten = torch.ops.aten


def _case(shape, normalized, affine, dtype, device="cpu"):
    torch.manual_seed(0)
    x = (torch.randn(shape, dtype=dtype) * 3 + 1).to(device)
    weight = torch.randn(normalized, dtype=dtype, device=device) if affine else None
    bias = torch.randn(normalized, dtype=dtype, device=device) if affine else None
    _, mean, rstd = aten.native_layer_norm(x, normalized, weight, bias, 1e-5)
    grad = torch.randn(shape, dtype=dtype, device=device)
    return grad, x, normalized, mean, rstd, weight, bias


def _errors(got, expected, exact) -> list[float]:
    return [0.0 if e is None else float((g.double() - x).abs().max()) for g, e, x in zip(got, expected, exact)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "normalized"), [((4, 7, 16), [16]), ((3, 5, 4, 6), [4, 6]), ((10,), [10]), ((5, 1), [1])])
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True), (False, True, False)])
def test_rewrite_is_as_exact_as_the_op(dtype, shape, normalized, mask) -> None:
    """Each result within eager's own rounding error of the float64 op on the same inputs, or a
    few units of rounding of its terms (one normalized element: the input gradient is 0 plus
    rounding times rstd, eager's float32 value about 3e-5)."""
    args = _case(shape, normalized, True, dtype)
    got = normalization.layer_norm_backward(*args, list(mask))
    expected = aten.native_layer_norm_backward(*args, list(mask))
    wide = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
    exact = aten.native_layer_norm_backward(*wide, list(mask))
    for g, e in zip(got, expected, strict=True):
        assert (g is None) == (e is None)
        if e is not None:
            assert g.shape == e.shape and g.dtype == e.dtype
    grad, _, _, _, rstd, weight, _ = args
    # rounding of the terms that cancel in the input gradient, scaled by rstd
    scale = max(1.0, float(rstd.max() * grad.abs().max() * weight.abs().max()))
    ulp = torch.finfo(dtype).eps
    for mine, eagers, x in zip(_errors(got, expected, exact), _errors(expected, expected, exact), exact, strict=True):
        if x is not None:
            assert mine <= 4 * eagers + 16 * ulp * max(scale, float(x.abs().max())), (mine, eagers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rewrite_without_weight(dtype) -> None:
    args = _case((6, 3, 8), [8], False, dtype)
    got = normalization.layer_norm_backward(*args, [True, False, False])
    expected = aten.native_layer_norm_backward(*args, [True, False, False])
    assert got[1] is None and got[2] is None
    assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)


def test_non_finite_gradients_spread_as_eager() -> None:
    """Non-finite exactly where eager's are (a row with an infinite gradient: eager's kernel NaN
    throughout, torch's decomposition and this rewrite inf where the terms do not cancel)."""
    grad, *rest = _case((4, 8), [8], True, torch.float32)
    grad[1, 2], grad[2, 0], grad[3, 5] = float("inf"), float("-inf"), float("nan")
    got = normalization.layer_norm_backward(grad, *rest, [True, True, True])
    expected = aten.native_layer_norm_backward(grad, *rest, [True, True, True])
    for g, e in zip(got, expected, strict=True):
        finite = torch.isfinite(e)
        assert torch.equal(torch.isfinite(g), finite)
        assert_close(g[finite], e[finite], rtol=1e-5, atol=1e-5)


def _mm_count(*args: torch.Tensor) -> int:
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda *a: normalization.layer_norm_backward(*a[:2], [8], *a[2:], [True, True, True]))(*args)
    return sum(n.target is aten.mm.default for n in graph.graph.nodes)


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "meta"])
def test_other_dtypes_and_devices_keep_torchs_decomposition(kind) -> None:
    """No matrix products off the CPU (CUDA's may round through TF32) nor in half precision
    (torch's decomposition computes those in float32)."""
    grad, x, _, mean, rstd, weight, bias = _case((4, 8), [8], True, torch.float32)
    if kind == "meta":
        tensors = [t.to("meta") for t in (grad, x, mean, rstd, weight, bias)]
    else:
        dtype = getattr(torch, kind)
        tensors = [t.to(dtype) for t in (grad, x, mean, rstd, weight, bias)]
    assert _mm_count(*tensors) == 0
    assert _mm_count(grad, x, mean, rstd, weight, bias) == 2


def _model(kind: str) -> tuple[nn.Module, torch.Tensor]:
    if kind == "affine":
        return nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(4, 5, 16)
    if kind == "no-bias":
        return nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16, bias=False), nn.Linear(16, 4)), torch.randn(3, 16)
    if kind == "plain":
        return nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16, elementwise_affine=False), nn.Linear(16, 4)), torch.randn(6, 16)
    # normalized over the last two axes
    return nn.Sequential(nn.Linear(6, 6), nn.LayerNorm([5, 6]), nn.Tanh()), torch.randn(3, 5, 6)


@pytest.mark.parametrize("kind", ["affine", "no-bias", "plain", "2-d"])
def test_training_matches_eager(kind) -> None:
    """Outputs, gradients and updated weights follow eager over three steps; ORT ran."""
    torch.manual_seed(0)
    x = _model(kind)[1] * 2 + 0.5
    metrics.reset()
    train_parity(lambda: _model(kind)[0], [x], steps=3, lr=0.05, rtol=1e-4, atol=1e-5)
    assert_ran_on_ort(2)


def _full_size_writes() -> list[str]:
    """Ops of the backward region that write a tensor of the layer norm's input size."""
    x = torch.randn(8, 64, requires_grad=True)
    layer = nn.LayerNorm(64)
    with captured_exports() as models:
        compile_ort(layer)(x).sin().sum().backward()
    backward = next(m for m in models if m.name.startswith("backward"))
    return [op for op in full_size_nodes(backward.model_bytes, x.numel()) if op != "Reshape"]


def test_backward_writes_eight_full_size_tensors() -> None:
    """Deviation, xhat, g * xhat, g * w, and four for the input gradient (the sine's gradient,
    its cosine, is computed in the forward region)."""
    writes = _full_size_writes()
    assert sorted(writes) == ["Mul"] * 5 + ["Sub"] * 3, writes


def test_write_count_check_sees_torchs_decomposition() -> None:
    """The check above can fail: torch's own decomposition writes more full-size tensors."""
    with torch_decomposition_of(aten.native_layer_norm_backward.default):
        assert len(_full_size_writes()) > 8

"""Sums over leading axes run as a MatMul with ones on ORT's CPU provider (export/reductions.py)."""

from __future__ import annotations

import copy

import onnx
import onnxruntime as ort
import pytest
import torch

from helpers import assert_close, assert_ran_on_ort, aten_graph, compile_ort
from ort_lazy import metrics
from ort_lazy.export.fx import export_graph

CPU = ("CPUExecutionProvider",)


def _run(fn, *args, providers=CPU):
    """(ops of the exported graph, its outputs run on ORT's CPU provider)."""
    model = export_graph(aten_graph(fn, *args), "sums", providers=providers)
    proto = onnx.load_from_string(model.model_bytes)
    session = ort.InferenceSession(model.model_bytes, providers=["CPUExecutionProvider"])
    got = session.run(None, {n: a.numpy() for n, a in zip(model.input_names, args)})
    return [n.op_type for n in proto.graph.node], [torch.from_numpy(g) for g in got]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("shape", "dims", "keepdim"),
    [
        ((394, 192), [0], True),  # a linear layer's bias gradient
        ((2, 197, 192), [0, 1], False),  # layer norm's weight gradient
        ((2, 197, 192), [1, 0], True),  # axes in any order
        ((3, 4, 5, 6), [-4, -3], False),  # negative axes
        ((5, 1), [0], False),  # one output element
    ],
)
def test_leading_sums_become_a_matmul_with_eager_values(dtype, shape, dims, keepdim) -> None:
    x = torch.randn(shape, dtype=dtype) * 10
    ops, [got] = _run(lambda t: torch.ops.aten.sum.dim_IntList(t, dims, keepdim), x)
    assert "ReduceSum" not in ops and "MatMul" in ops, ops
    expected = x.sum(dims, keepdim=keepdim)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert_close(got, expected, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-4 if dtype == torch.float32 else 1e-10)


def test_float16_sums_add_in_float32() -> None:
    """The exporter casts float16 to float32 before the sum: that sum is rewritten."""
    dtype = torch.float16
    x = torch.randn(64, 16, dtype=dtype)
    ops, [got] = _run(lambda t: t.sum(0), x)
    assert "MatMul" in ops and "ReduceSum" not in ops, ops
    assert got.dtype == dtype
    assert_close(got.float(), x.sum(0).float(), rtol=1e-2, atol=1e-2)


def test_non_finite_elements_sum_as_eager() -> None:
    x = torch.randn(6, 4)
    x[1, 0], x[2, 1], x[3, 1], x[4, 2] = float("inf"), float("inf"), float("-inf"), float("nan")
    ops, [got] = _run(lambda t: t.sum(0), x)
    assert "MatMul" in ops
    expected = x.sum(0)
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
    finite = expected.isfinite()
    assert torch.equal(got[~finite].nan_to_num(), expected[~finite].nan_to_num())
    assert_close(got[finite], expected[finite])


@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (lambda t: t.sum(1), torch.randn(4, 5)),  # trailing axis: ORT's contiguous reduction is fast
        (lambda t: t.sum((0, 2)), torch.randn(4, 5, 6)),  # not a leading block
        (lambda t: t.sum((0, 1)), torch.randn(4, 5)),  # every axis
        (lambda t: t.sum(0), torch.randint(0, 9, (4, 5))),  # integers
        (lambda t: t.sum(0), torch.randn(1, 5)),  # nothing to add
    ],
)
def test_other_sums_stay_reduce_sum(fn, x) -> None:
    ops, [got] = _run(fn, x)
    assert "MatMul" not in ops, ops
    assert_close(got, fn(x), rtol=1e-3, atol=1e-3)


def test_only_the_cpu_provider_gets_the_matmul() -> None:
    x = torch.randn(8, 16)
    for providers in (("CUDAExecutionProvider", "CPUExecutionProvider"), None):
        ops, _ = _run(lambda t: t.sum(0), x, providers=providers)
        assert "ReduceSum" in ops and "MatMul" not in ops, (providers, ops)


def test_sum_that_is_a_graph_output_keeps_its_name() -> None:
    model = export_graph(aten_graph(lambda t: (t.sum(0), t * 2), torch.randn(8, 3)), "sums", providers=CPU)
    proto = onnx.load_from_string(model.model_bytes)
    producers = {o: n.op_type for n in proto.graph.node for o in n.output}
    assert producers[model.output_names[0]] == "Reshape"
    assert "ReduceSum" not in producers.values()


def test_transformer_block_trains_with_eager_gradients_and_no_leading_reduce_sum() -> None:
    """Bias and layer-norm gradients (every linear layer's ``sum(grad, [0])``) go through the
    rewrite in a real training graph; the gradients match eager and ORT ran both regions."""
    from helpers import captured_exports

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    reference = copy.deepcopy(block)
    x = torch.randn(4, 10, 32)
    metrics.reset()
    with captured_exports() as models:
        compile_ort(block)(x).square().mean().backward()
    assert_ran_on_ort(2)
    reference(x).square().mean().backward()
    for got, expected in zip(block.parameters(), reference.parameters()):
        assert_close(got.grad, expected.grad)
    nodes = [n for model in models for n in onnx.load_from_string(model.model_bytes).graph.node]
    # two bias gradients and layer norm's weight and bias gradients; layer norm's per-row sums
    # are products with its weight (lowering.normalization.layer_norm_backward), so no sum is left
    assert sum(n.op_type == "MatMul" and n.name.endswith("_matmul") for n in nodes) == 4
    assert sum(n.op_type == "ReduceSum" for n in nodes) == 0


def test_variance_far_from_zero_keeps_its_digits() -> None:
    """``var``/``std``/``var_mean`` of data far from 0 against its spread: the translation's
    mean is a float32 sum, so float32 ``1e4 + 0.01 * randn`` lost 1e-3 relative (eager
    accumulates in double), and a constant float64 column of 3e38 had variance 1.7e45 for 0.
    Shifted by its first element the data's differences are exact: within 1e-6 of a long-double
    reference in float32 (4e-16 in float64, where eager's own Welford sum is 1e-11 off)."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    base = 1e4 + torch.randn(4, 1000, generator=g, dtype=torch.float64) * 0.01

    def fn(t: torch.Tensor, u: torch.Tensor):
        return t.var(1), t.std(1) ** 2, torch.var_mean(t, 1)[0], u.var(0), u.std(1, correction=0), t.var(1, correction=2000)

    constant = torch.full((6, 3), 3e38, dtype=torch.float64)
    for dtype, bound in ((torch.float32, 1e-6), (torch.float64, 1e-14)):
        x = base.to(dtype)
        got = compile_ort(fn)(x, constant)
        c = metrics.counters()
        assert c["ort_runs"] >= 1 and c["fallback_ops"] == 0, metrics.fallbacks()
        # the rows' variances in long double, of the values as this dtype holds them
        exact = torch.tensor([float(np.var(np.array(r, dtype=np.longdouble), ddof=1)) for r in x.double().numpy()], dtype=torch.float64)
        for value in got[:3]:
            assert float(((value.double() - exact) / exact).abs().max()) < bound, (dtype, value, exact)
        assert torch.equal(got[3], torch.zeros(3, dtype=torch.float64)) and torch.equal(got[4], torch.zeros(6, dtype=torch.float64))
        assert torch.isinf(got[5]).all()  # a correction past the count: eager divides by max(0, N - c)

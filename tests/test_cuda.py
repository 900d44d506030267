"""CUDA: parity with eager on the GPU, forward and backward, with ORT's CUDA execution provider.

Skipped unless torch sees a GPU and the installed onnxruntime has ``CUDAExecutionProvider``
(``onnxruntime-gpu``; ``python build.py --use_cuda``). ``ci/gpu_check.sh`` runs these on a CUDA
machine. Every test compares with eager PyTorch on the same GPU and proves ORT ran there (its
sessions hold the CUDA provider), so a silent fallback to PyTorch or to ORT's CPU provider
cannot pass. What needs no GPU (provider options, the TF32 switch, the cache key) is tested in
``test_runtime.py`` on every machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from helpers import (
    assert_close,
    assert_ran_on_ort,
    captured_exports,
    compile_ort,
    cuda_ready,
    cuda_sessions,
    max_rel_error,
    train_parity,
)
from ort_lazy import metrics

pytestmark = pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA GPU and onnxruntime-gpu (CUDAExecutionProvider)")

DEV = "cuda"


@contextlib.contextmanager
def _tf32(matmul: bool) -> Iterator[None]:
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = matmul
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int64, torch.int32]


def _float_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.gelu(x @ w) + x.sum(-1, keepdim=True) / 3
    return torch.softmax(h, -1) * torch.tanh(h) - h.mean()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_forward_backward(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=gen).to(DEV, dtype)
    w = (torch.randn(16, 16, generator=gen) / 4).to(DEV, dtype)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected = _float_fn(xr, wr)
    actual = compile_ort(_float_fn)(xo, wo)
    assert actual.device == expected.device
    tol = {torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-4)
    assert_close(actual.detach(), expected.detach(), rtol=tol, atol=tol)
    expected.pow(2).sum().backward()
    actual.pow(2).sum().backward()
    assert_close(xo.grad, xr.grad, rtol=tol, atol=tol)
    assert_close(wo.grad, wr.grad, rtol=tol, atol=tol)
    c = assert_ran_on_ort(2)  # forward and backward
    assert c["ort_failures"] == 0, metrics.fallbacks()
    cuda_sessions()


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_int_forward(dtype):
    def f(a, b):
        return ((a * b + a) // 3 - b).abs().sum(-1) + torch.where(a > b, a, b).max(-1).values

    a = torch.randint(-50, 50, (6, 7), device=DEV, dtype=dtype)
    b = torch.randint(1, 9, (6, 7), device=DEV, dtype=dtype)
    actual = compile_ort(f)(a, b)
    assert torch.equal(actual, f(a, b))
    c = assert_ran_on_ort()
    assert c["ort_failures"] == 0
    cuda_sessions()


def test_bool():
    def f(a, b):
        return ((a & b) | ~a) ^ (a.int() > 0)

    a = torch.rand(5, 9, device=DEV) > 0.5
    b = torch.rand(5, 9, device=DEV) > 0.3
    actual = compile_ort(f)(a, b)
    assert torch.equal(actual, f(a, b))
    c = metrics.counters()
    # ran on ORT, or left to PyTorch up front with a counted reason; never a failed session
    assert c["ort_runs"] > 0 or c["fallback_ops"] > 0, c
    assert c["ort_failures"] == 0


def test_mlp_training():
    def make():
        return torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)
        ).to(DEV)

    x = torch.randn(16, 32, device=DEV)
    train_parity(make, [x], steps=3)
    assert_ran_on_ort(6)
    cuda_sessions()


def test_transformer_layer_training():
    def make():
        return torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).to(DEV)

    x = torch.randn(4, 12, 64, device=DEV)
    train_parity(make, [x], steps=2, rtol=1e-3, atol=1e-4)
    assert_ran_on_ort(4)
    cuda_sessions()


def test_cnn_training():
    def make():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(8, 5),
        ).to(DEV)

    x = torch.randn(4, 3, 16, 16, device=DEV)
    # eager convolutions may use TF32 (torch.backends.cudnn.allow_tf32, on by default)
    train_parity(make, [x], steps=2, rtol=5e-3, atol=1e-3, torch_preferred_ops=())
    assert_ran_on_ort(4)
    cuda_sessions()


@pytest.mark.parametrize("allow", [False, True], ids=["fp32", "tf32"])
def test_float32_products_follow_torchs_tf32_setting(allow):
    """ORT's CUDA provider uses TF32 unless told otherwise; torch does not by default. A
    compiled product is as precise as eager's when torch forbids TF32."""

    def f(a, b):
        return a @ b

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 1024, generator=gen).to(DEV)
    b = torch.randn(1024, 256, generator=gen).to(DEV)
    exact = a.double() @ b.double()
    with _tf32(allow):
        actual = compile_ort(f)(a, b)
        eager = f(a, b)
    (session,) = cuda_sessions()
    assert session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"] == ("1" if allow else "0")
    err = float((actual.double() - exact).abs().max() / exact.abs().max())
    eager_err = float((eager.double() - exact).abs().max() / exact.abs().max())
    if not allow:
        assert err < 1e-5, (err, eager_err)  # TF32 is ~1e-3 off here
        assert eager_err < 1e-5


def test_runs_on_torchs_current_stream():
    def f(x):
        return torch.relu(x) * 2 + 1

    x = torch.randn(64, 64, device=DEV)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = compile_ort(f)(x)
    (session,) = cuda_sessions()
    opts = session.get_provider_options()["CUDAExecutionProvider"]
    assert opts["has_user_compute_stream"] == "1"
    assert int(opts["user_compute_stream"]) == side.cuda_stream
    torch.cuda.synchronize()
    assert_close(out, f(x))


def _slow_producer(x: torch.Tensor, rounds: int = 30) -> torch.Tensor:
    """Enough GPU work (about tens of ms) that a consumer not ordered after it reads stale data."""
    big = torch.randn(2048, 2048, device=x.device)
    for _ in range(rounds):
        big = torch.tanh(big @ big / 2048)
    return x + big[: x.shape[0], : x.shape[1]] * 0 + 1


def test_call_under_another_stream_waits_for_its_work():
    """A session made under one stream, called under another whose kernels produce the input:
    ORT's stream waits for the caller's, and the caller's for ORT's outputs."""

    def f(x):
        return torch.relu(x) * 2 + 1

    compiled = compile_ort(f)
    x = torch.randn(256, 256, device=DEV)
    assert_close(compiled(x), f(x))  # the session lives on the default stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for _ in range(3):
        with torch.cuda.stream(side):
            y = _slow_producer(x)
            out = compiled(y)
            out = out * 1  # consumed on the side stream right away
        with torch.cuda.stream(side):
            expected = f(y)
        torch.cuda.synchronize()
        assert_close(out, expected)
    assert metrics.counters()["stream_handoffs"] == 3
    assert metrics.counters()["sessions_created"] == 1


@pytest.mark.parametrize("stream", ["default", "side"])
def test_outputs_ordered_without_host_wait(stream):
    """ORT's end-of-run GPU wait is off for torch-owned outputs; ORT reads inputs after torch's
    kernels wrote them and torch's next kernels on the same stream see the finished values, on
    torch's default stream (handle 0, which ORT would read as "none") as on another."""

    def f(x):
        return (x @ x).relu() + 1

    compiled = compile_ort(f)
    side = torch.cuda.Stream() if stream == "side" else torch.cuda.current_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x = _slow_producer(torch.randn(512, 512, device=DEV), rounds=10)
            out = compiled(x).sum()
            expected = f(x).sum()
            torch.cuda.synchronize()
            assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert metrics.counters()["stream_handoffs"] == 0


def test_mixed_device_inputs():
    def f(x, scale):
        return x * scale + x.sum()

    x = torch.randn(4, 8, device=DEV)
    scale = torch.tensor(3.0)  # a CPU scalar tensor with a CUDA one: allowed in eager
    actual = compile_ort(f)(x, scale)
    assert actual.device == x.device
    assert_close(actual, f(x, scale))


def test_session_cache_by_input_schema():
    def f(x):
        return torch.sigmoid(x) * x

    compiled = compile_ort(f)
    for shape in [(4, 8), (4, 8), (4, 8)]:
        x = torch.randn(*shape, device=DEV)
        assert_close(compiled(x), f(x))
    c = metrics.counters()
    assert c["sessions_created"] == 1, c
    assert c["ort_runs"] == 3


def test_cpu_and_cuda_calls_of_one_function():
    def f(x):
        return torch.cos(x) + x * x

    compiled = compile_ort(f)
    for device in ("cpu", DEV, "cpu", DEV):
        x = torch.randn(3, 5, device=device)
        out = compiled(x)
        assert out.device == x.device
        assert_close(out, f(x))
    assert_ran_on_ort(4)


def test_inference_under_no_grad_and_half_model():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.SiLU(), torch.nn.Linear(64, 8))
    model = model.to(DEV).half().eval()
    x = torch.randn(5, 32, device=DEV, dtype=torch.float16)
    with torch.no_grad():
        expected = model(x)
        actual = compile_ort(model)(x)
    assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    assert_ran_on_ort()
    cuda_sessions()


def test_fp16_precision_computes_products_in_float16():
    """``precision="fp16"`` on ORT's CUDA provider: the products run in float16 (its kernels,
    not the CPU-side simulation ``test_half.py`` checks), the region's edges stay float32, the
    result within float16's error of eager float32, and a weight change is followed."""
    import onnx

    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).to(DEV).eval()
    x = torch.randn(2, 16, 64, device=DEV)
    with torch.no_grad(), _tf32(False), captured_exports() as models:
        compiled = compile_ort(model, precision="fp16")
        expected, got = model(x), compiled(x)
        assert got.dtype == torch.float32
        assert max_rel_error(got, expected) < 1e-2
        model.linear2.bias.add_(1.0)
        expected, got = model(x), compiled(x)
        assert max_rel_error(got, expected) < 1e-2
    assert_ran_on_ort(2)
    cuda_sessions()
    graph = onnx.shape_inference.infer_shapes(onnx.load_from_string(models[0].model_bytes)).graph
    types = {v.name: v.type.tensor_type.elem_type for v in graph.value_info}
    products = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    assert products and all(types.get(n.output[0]) == onnx.TensorProto.FLOAT16 for n in products)


def test_changed_weight_between_calls():
    model = torch.nn.Linear(16, 4).to(DEV).eval()
    compiled = compile_ort(model)
    x = torch.randn(3, 16, device=DEV)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        model.weight.mul_(2)
        assert_close(compiled(x), model(x))


@pytest.mark.parametrize("limit", ["copied", "inputs"])
def test_gpu_weights_follow_instances_and_changes(monkeypatch, limit):
    """GPU inference weights copied into the model (or inputs past the size limit): each
    module instance served by the one graph computes with its own weights, also after an
    in-place change; channels-last weights included."""
    from ort_lazy.lowering import aten as aten_mod

    torch._dynamo.reset()
    if limit == "inputs":
        monkeypatch.setattr(aten_mod, "GPU_COPIED_WEIGHTS_BYTES", 16)

    def make(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 36, 4)
        )
        return model.to(DEV).to(memory_format=torch.channels_last).eval()

    models = [make(seed) for seed in range(3)]
    x = torch.randn(2, 3, 8, 8, device=DEV).to(memory_format=torch.channels_last)
    compiled = [torch.compile(m, backend="ort") for m in models]
    with torch.no_grad():
        for model, fn in zip(models, compiled):
            assert_close(fn(x), model(x))
        models[1][0].weight.mul_(-0.5)
        for model, fn in zip(models, compiled):
            assert_close(fn(x), model(x))
    c = assert_ran_on_ort()
    assert c["ort_failures"] == 0 and c["compile_failures"] == 0, metrics.fallbacks()
    assert c["weight_sets"] == (2 if limit == "copied" else 0)
    cuda_sessions()


def test_attention_on_cuda_runs_on_ort():
    """Attention in a GPU inference graph (traced through the math path) runs on ORT."""
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(DEV).eval()
    x = torch.randn(2, 9, 32, device=DEV)
    with torch.no_grad():
        actual = compile_ort(layer)(x)
        expected = layer(x)
    assert_close(actual, expected, rtol=1e-3, atol=1e-4)
    c = assert_ran_on_ort()
    assert not [op for op in metrics.fallbacks() if "scaled_dot_product" in op], metrics.fallbacks()
    assert c["fallback_ops"] == 0, metrics.fallbacks()


def test_torchscript_graph_on_cuda():
    from ort_lazy.frontends import jit as jit_frontend

    try:
        jit_frontend.load_bridge()
    except jit_frontend.BridgeUnavailableError as e:
        pytest.skip(f"bridge not built: {e}")
    import ort_lazy.jit

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(DEV).eval()
    x = torch.randn(5, 8, device=DEV)
    traced = torch.jit.trace(model, x)
    with torch.no_grad():
        expected = model(x)
        with ort_lazy.jit.enable():
            for _ in range(3):  # the profiling runs, then ORT
                actual = traced(x)
    assert_close(actual, expected)
    assert_ran_on_ort()
    cuda_sessions()

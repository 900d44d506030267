"""Runtime: zero copy, session cache, non-contiguous inputs, threads, export details."""

from __future__ import annotations

import threading

import pytest
import torch

import ort_lazy
from helpers import assert_close, assert_ran_on_ort, captured_exports, compile_ort, take_sessions
from ort_lazy import metrics
from ort_lazy.export.fx import export_graph
from ort_lazy.options import Options
from ort_lazy.runtime import flavour
from ort_lazy.runtime.session import OrtRunner
from ort_lazy.runtime.session_cache import SessionCache
from ort_lazy.specs import TensorSpec


def _traced(fn, *example):
    """An aten FX graph of ``fn`` with fake ``meta['val']`` on every node."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*example)


def _runner(fn, *example, options=None):
    gm = _traced(fn, *example)
    model = export_graph(gm, "test")
    return OrtRunner(model, options or Options(), torch.device("cpu"))


def test_inputs_and_outputs_cross_without_copy(monkeypatch):
    runner = _runner(lambda x: x + 1, torch.zeros(4))
    seen = {}
    from ort_lazy.runtime import _ort

    real_binding = _ort.new_binding(runner._sess)

    class Spy:
        def bind_input(self, name, dev, et, shape, ptr):
            seen["in"] = ptr
            return real_binding.bind_input(name, dev, et, shape, ptr)

        def bind_output(self, name, dev, *rest):
            if rest:
                seen["out"] = rest[-1]
            return real_binding.bind_output(name, dev, *rest)

        def __getattr__(self, item):
            return getattr(real_binding, item)

    runner._binding()  # per-thread state first, then the spy in place of the binding
    runner._local.binding = Spy()
    x = torch.arange(4, dtype=torch.float32)
    (out,) = runner.run([x])
    assert seen["in"] == x.data_ptr()  # ORT read the torch buffer itself
    assert seen["out"] == out.data_ptr()  # and wrote straight into the returned tensor
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_dynamic_output_crosses_by_dlpack():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv  # noqa: F401

    torch._dynamo.reset()
    model = torch.nn.Linear(4, 3)
    compiled = compile_ort(model)
    with torch.no_grad():
        for b in (2, 3, 7):
            x = torch.randn(b, 4)
            assert_close(compiled(x), model(x))
    assert_ran_on_ort(3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(6, 4).t(),  # transposed
        lambda: torch.randn(8, 8)[::2, 1::3],  # strided
        lambda: torch.randn(3, 4, 5).permute(2, 0, 1),
        lambda: torch.randn(10)[3:7],  # storage offset
    ],
    ids=["transposed", "strided", "permuted", "offset"],
)
def test_non_contiguous_inputs(make):
    def f(x):
        return torch.sin(x) * 2 + x

    x = make()
    assert_close(compile_ort(f)(x), f(x))
    assert_ran_on_ort()


def test_zero_size_and_scalar_inputs():
    def f(x, s):
        return x * s + 1

    for x in (torch.randn(0, 3), torch.tensor(2.0)):
        s = torch.tensor(3.0)
        assert_close(compile_ort(f)(x, s), f(x, s))


def test_nan_and_inf_values():
    def f(x):
        return x * 2 - 1

    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    out = compile_ort(f)(x)
    torch.testing.assert_close(out, f(x), equal_nan=True)
    assert_ran_on_ort()


def test_session_cache_is_bounded_lru():
    cache = SessionCache(capacity=2)
    made = []
    for key in ("a", "b", "a", "c", "b"):
        cache.get_or_create(key, lambda k=key: made.append(k) or k)
    # "a" stayed hot; "b" was evicted by "c" and rebuilt
    assert made == ["a", "b", "c", "b"]
    assert len(cache) == 2


def test_session_on_tensor_memory_ends_with_the_tensor():
    """A session reading a tensor's memory (shared initializers, prepacked copies of it) leaves
    the cache when the tensor is freed: a later tensor at the same address, with the same
    version counter, is never served that session's stale packed weights."""
    import gc

    from ort_lazy.runtime.session_cache import session_cache

    w = torch.randn(8, 8)
    gm = _traced(lambda x, w: x @ w, torch.ones(2, 8), w)
    model = export_graph(gm, "on_memory", {1: w}, ("CPUExecutionProvider",), shared=True)
    assert model.external
    runner = OrtRunner(model, Options(), torch.device("cpu"), initializers={n: w for n in model.external})
    x = torch.randn(2, 8)
    assert_close(runner.run([x])[0], x @ w)
    cache = session_cache()
    (key,) = [k for k in cache._items if k[0] == model.digest]
    assert key in cache
    del runner, w
    gc.collect()
    assert key not in cache


def test_session_cache_builds_once_under_threads():
    cache = SessionCache(capacity=4)
    calls = []
    barrier = threading.Barrier(8)

    def factory():
        calls.append(1)
        return object()

    results = []

    def worker():
        barrier.wait()
        results.append(cache.get_or_create("k", factory))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len({id(r) for r in results}) == 1


def test_one_compiled_model_from_many_threads():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    compiled = compile_ort(model)
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    errors = []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            with torch.no_grad():
                for _ in range(50):
                    x = torch.randn(4, 8, generator=g)
                    assert_close(compiled(x), model(x))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert_ran_on_ort(200)


def test_symbolic_dims_kept_in_onnx():
    import onnx

    model = torch.nn.Linear(4, 2)
    with captured_exports() as captured:
        compiled = compile_ort(model)
        with torch.no_grad():
            compiled(torch.randn(2, 4))
            compiled(torch.randn(3, 4))
    dims = onnx.load_from_string(captured[-1].model_bytes).graph.input
    symbolic = [d.dim_param for i in dims for d in i.type.tensor_type.shape.dim if d.dim_param]
    assert symbolic, "the dynamic graph's ONNX model should carry a named batch dim"
    assert captured[-1].output_specs[0].shape[0] == symbolic[0] or not captured[-1].output_specs[0].static


def test_ir_version_within_installed_ort():
    runner = _runner(lambda x: x * 2, torch.zeros(2))
    import onnx

    assert onnx.load_from_string(runner.model.model_bytes).ir_version <= 11
    assert flavour.max_ir_version() in (10, 11)
    assert flavour.flavour() in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-training")


def test_ir_version_clamped_for_training_flavour(monkeypatch):
    from ort_lazy.runtime import session_create

    monkeypatch.setattr(session_create, "max_ir_version", lambda: 9)
    runner_model = _runner(lambda x: x * 2, torch.zeros(2)).model
    import onnx

    clamped = session_create._clamp_ir_version(runner_model.model_bytes)
    assert onnx.load_from_string(clamped).ir_version == 9


_lib = torch.library.Library("ortlazy_rt", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
torch.library.impl(_lib, "twice", "CompositeExplicitAutograd")(lambda x: x * 2)
torch.library.register_fake("ortlazy_rt::twice")(lambda x: torch.empty_like(x))


def _config(sess, key):
    return sess.get_session_options().get_session_config_entry(key)


def test_spinning_within_runs_parked_after_each_run():
    def f(x):
        return torch.ops.ortlazy_rt.twice(torch.relu(x)).sum()

    compile_ort(f)(torch.randn(8))
    sessions = take_sessions()
    assert sessions, "expected an ORT session"
    for sess in sessions:
        assert _config(sess, "session.intra_op.allow_spinning") == "1"
        assert _config(sess, "session.force_spinning_stop") == "1"


def test_memory_pattern_off_by_default_and_settable():
    compile_ort(lambda x: torch.relu(x) + 1)(torch.randn(8))
    (sess,) = take_sessions()
    assert sess.get_session_options().enable_mem_pattern is False
    compile_ort(lambda x: torch.relu(x) + 2, session_options={"enable_mem_pattern": True})(torch.randn(8))
    (sess,) = take_sessions()
    assert sess.get_session_options().enable_mem_pattern is True


def test_spinning_can_be_turned_off():
    compile_ort(lambda x: torch.relu(x) + 1, allow_spinning=False)(torch.randn(8))
    sessions = take_sessions()
    assert len(sessions) == 1
    assert _config(sessions[0], "session.intra_op.allow_spinning") == "0"


def test_tensor_spec_static():
    assert TensorSpec(torch.float32, (2, 3), torch.device("cpu")).static
    assert not TensorSpec(torch.float32, ("s0", 3), torch.device("cpu")).static


def test_metrics_report_and_reset():
    compile_ort(lambda x: x + 1)(torch.ones(2))
    text = ort_lazy.metrics.report()
    assert "ort_runs" in text and "export" in text
    metrics.reset()
    assert metrics.counters()["ort_runs"] == 0


class _FakeStream:
    cuda_stream = 1234


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_cuda_provider_options_follow_torch(monkeypatch, allow_tf32):
    """The CUDA provider runs on torch's current stream and uses TF32 exactly when torch's
    float32 products may (ORT's default is on); explicit provider options win. (Runs without a
    GPU: the options are built from torch's settings; tests/test_cuda.py checks them on one.)"""
    from ort_lazy.runtime import session_create

    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: _FakeStream())
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        opts = session_create.provider_options_for("CUDAExecutionProvider", Options(), torch.device("cuda", 1))
        assert session_create.cuda_tf32() is allow_tf32
    finally:
        torch.set_float32_matmul_precision(before)
    assert opts == {
        "device_id": "1",
        "has_user_compute_stream": "1",
        "user_compute_stream": "1234",
        "use_tf32": "1" if allow_tf32 else "0",
    }
    mine = Options(provider_options={"CUDAExecutionProvider": {"use_tf32": 1, "device_id": 0}})
    opts = session_create.provider_options_for("CUDAExecutionProvider", mine, torch.device("cuda", 1))
    assert opts["use_tf32"] == "1" and opts["device_id"] == "0"
    # CPU sessions get none of it
    assert session_create.provider_options_for("CPUExecutionProvider", Options(), torch.device("cpu")) == {}


def test_cuda_default_stream_named_explicitly(monkeypatch):
    """torch's default stream reports the handle 0, which ORT reads as "no stream given" (it then
    runs on a stream of its own, unordered with torch's: wrong results on a GPU); the session
    gets cudaStreamLegacy, the same stream by its explicit name. Other streams pass unchanged."""
    from ort_lazy.runtime import session_create

    class _Default:
        cuda_stream = 0

    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: _Default())
    opts = session_create.provider_options_for("CUDAExecutionProvider", Options(), torch.device("cuda", 0))
    assert opts["user_compute_stream"] == str(session_create.CUDA_STREAM_LEGACY) == "1"
    assert session_create.ort_stream_handle(0) == 1 and session_create.ort_stream_handle(1234) == 1234


def test_gpu_inference_weight_modes():
    """ORT reads external initializers on the host, so CUDA weights are never ``shared``: they
    are copied into the model (ORT folds them) up to a size, graph inputs beyond it or with
    ``prepack_weights`` off; frozen and quantized weights are baked in on any device."""
    from ort_lazy.lowering.aten import GPU_COPIED_WEIGHTS_BYTES, weight_mode

    assert weight_mode(Options(), "cpu") == "shared"
    assert weight_mode(Options(), "cuda", 1 << 20) == "copied"
    assert weight_mode(Options(), "cuda", GPU_COPIED_WEIGHTS_BYTES + 1) is None
    assert weight_mode(Options(prepack_weights=False), "cuda") is None
    assert weight_mode(Options(prepack_weights=False), "cpu") is None
    assert weight_mode(Options(freeze_weights=True), "cuda") == "snapshot"
    assert weight_mode(Options(precision="int8-dynamic"), "cuda") == "copied"


@pytest.mark.parametrize("limit", ["copied", "inputs"])
def test_gpu_weight_paths_follow_weight_changes(monkeypatch, limit):
    """The GPU lowering decisions, taken on CPU tensors (the device check patched): weights
    copied into the model, or passed as inputs past the size limit; results match eager, and
    after an in-place update the next call uses the new weights (a rebuilt model, or the inputs
    themselves)."""
    from ort_lazy.lowering import aten as aten_mod

    torch._dynamo.reset()  # graphs compiled here, under this test's patches
    monkeypatch.setattr(aten_mod, "_inputs_device_type", lambda inputs: "cuda")
    if limit == "inputs":
        monkeypatch.setattr(aten_mod, "GPU_COPIED_WEIGHTS_BYTES", 16)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 36, 4)
    ).eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = torch.compile(model, backend="ort")
    with captured_exports() as exports, torch.no_grad():
        assert_close(compiled(x), model(x))
        model[0].weight.mul_(-0.5)
        model[4].bias.add_(1.0)
        assert_close(compiled(x), model(x))
    assert_ran_on_ort()
    first = exports[0]
    n_inputs = len(first.input_names)
    if limit == "copied":
        assert n_inputs == 1 and not first.external  # x only: every weight inside the model
        assert metrics.counters()["weight_refreshes"] == 1
    else:
        assert n_inputs > 1 and not first.external  # x and the weights
        assert metrics.counters()["weight_refreshes"] == 0


def test_gpu_inference_traces_attention_through_math():
    """On a GPU the fused attention kernels' ops (``_scaled_dot_product_efficient_attention``
    ...) have no ONNX translation: inference graphs for a GPU trace attention through the math
    path (matmuls and softmax ORT runs); on the CPU the fused op (translated) stays."""
    from ort_lazy.lowering.aten import _attention_backends

    q = torch.randn(1, 2, 4, 8)

    def targets(device_type: str) -> set[str]:
        with _attention_backends(device_type):
            gm = _traced(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q), q)
        return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}

    assert not [t for t in targets("cuda") if "scaled_dot_product" in t]
    assert any("_scaled_dot_product_flash_attention_for_cpu" in t for t in targets("cpu"))


def test_off_host_initializers_refused_not_crashing():
    """A session handed an external initializer outside host memory raises (the region falls
    back) instead of letting ORT dereference a device pointer."""
    from ort_lazy.runtime.session_create import OrtRunError, create_session

    model = export_graph(_traced(lambda x, w: x @ w, torch.ones(2, 2), torch.ones(2, 2)), "offhost")
    with pytest.raises(OrtRunError, match="host memory"):
        create_session(model, Options(), torch.device("cpu"), False, initializers={"w": torch.empty(2, 2, device="meta")})


def test_tf32_switch_read_from_either_torch_api():
    """torch's newer ``fp32_precision`` switch decides when set, also after the older API was
    used (which makes reading the older one raise); run apart, as mixing the two is sticky."""
    import subprocess
    import sys

    code = """
import torch
from ort_lazy.runtime.session_create import cuda_tf32
seen = [cuda_tf32()]
torch.backends.cuda.matmul.fp32_precision = "tf32"
seen.append(cuda_tf32())
torch.set_float32_matmul_precision("highest")
torch.backends.cuda.matmul.fp32_precision = "ieee"
seen.append(cuda_tf32())
torch.backends.cuda.matmul.fp32_precision = "none"
torch.backends.fp32_precision = "tf32"
seen.append(cuda_tf32())
print(seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[False, True, False, True]"

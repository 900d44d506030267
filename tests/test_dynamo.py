"""torch.compile(backend="ort"): parity with eager, forward and backward, and proof ORT ran."""

from __future__ import annotations

import copy
import logging
import os
import sys
import textwrap

import pytest
import torch

import forkserver
import ort_lazy
from helpers import assert_close, assert_ran_on_ort, compile_ort, tiered, train_parity
from ort_lazy import metrics
from ort_lazy.models import MLP, SeedModel, SmallCNN, TinyGPT

X_FLOATS = [-1.0, 1, [-1.0, 1.0, 2.0], [-0.0, 0.0, 7.0]]
X_INTS = [[1, -1], [2, 1], [-2, -2]]
FLOAT_TYPES = [torch.float64, torch.float32, torch.float16]
INT_TYPES = [torch.int64, torch.int32]


def seed(x: torch.Tensor) -> torch.Tensor:
    y = x * x
    z = y + x
    p = z * x
    q = p - x
    return q / x


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("x", X_FLOATS, ids=str)
def test_seed_float_forward_backward(x, dtype):
    compiled = compile_ort(seed)
    x_ref = torch.tensor(x, dtype=dtype, requires_grad=True)
    x_ort = torch.tensor(x, dtype=dtype, requires_grad=True)
    expected = seed(x_ref)
    actual = compiled(x_ort)
    # 0/0 gives NaN exactly where eager does
    assert torch.equal(torch.isnan(actual), torch.isnan(expected))
    assert_close(actual.detach(), expected.detach(), rtol=1e-3, atol=1e-3)
    expected.sum().backward()
    actual.sum().backward()
    assert torch.equal(torch.isnan(x_ort.grad), torch.isnan(x_ref.grad))
    assert_close(x_ort.grad, x_ref.grad, rtol=1e-3, atol=1e-3)
    c = assert_ran_on_ort(2)  # forward and backward graphs
    assert c["fallback_ops"] == 0


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
@pytest.mark.parametrize("x", X_INTS, ids=str)
def test_seed_int_forward(x, dtype):
    compiled = compile_ort(seed)
    xt = torch.tensor(x, dtype=dtype)
    expected = seed(xt)
    actual = compiled(xt)
    assert actual.dtype == expected.dtype == torch.float32  # true division promotes
    assert torch.equal(actual, expected)
    assert_ran_on_ort()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.bool], ids=str)
def test_bfloat16_and_bool_never_crash(dtype):
    def f(x, y):
        return (x * y + x) * y if dtype is torch.bfloat16 else (x & y) | (~x)

    if dtype is torch.bfloat16:
        x = torch.tensor([1.5, -2.0, 3.0], dtype=dtype)
        y = torch.tensor([2.0, 0.5, -1.0], dtype=dtype)
    else:
        x = torch.tensor([True, False, True])
        y = torch.tensor([True, True, False])
    compiled = compile_ort(f)
    assert torch.equal(compiled(x, y), f(x, y))
    c = metrics.counters()
    # either ORT ran it, or it fell back up front with a counted reason; never a session failure
    assert c["ort_runs"] > 0 or c["fallback_ops"] > 0
    assert c["ort_failures"] == 0


def test_op_without_any_kernel_falls_back_up_front():
    def f(x):
        return x + x  # bool Add: the translation emits Add(bool), which ORT has no kernel for

    x = torch.tensor([True, False])
    assert torch.equal(compile_ort(f)(x), f(x))
    fb = metrics.fallbacks()
    assert "aten.add.Tensor" in fb
    assert any("no ORT kernel" in reason for reason in fb["aten.add.Tensor"])
    assert metrics.counters()["ort_failures"] == 0


def test_bfloat16_mul_runs_on_ort_like_eager():
    def f(x):
        return x * x

    x = torch.tensor([1.5, -2.0, 3.3], dtype=torch.bfloat16)
    assert torch.equal(compile_ort(f)(x), f(x))
    c = assert_ran_on_ort()
    assert c["fallback_ops"] == 0 and c["ort_failures"] == 0


def test_mlp_train_matches_eager():
    train_parity(MLP, (torch.randn(32, 256),), steps=3)
    c = assert_ran_on_ort(6)
    assert c["fallback_ops"] == 0


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_transformer_encoder_layer(train):
    def make():
        return torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True, dropout=0.0)

    x = torch.randn(2, 16, 64)
    if train:
        train_parity(make, (x,), steps=2)
    else:
        torch.manual_seed(0)
        model = make().eval()
        compiled = compile_ort(model)
        with torch.no_grad():
            assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-4)
    c = assert_ran_on_ort()
    # the fused fast path and the fused attention backward are lowered, not left behind
    assert c["fallback_ops"] == 0, metrics.fallbacks()


def test_small_cnn_train_matches_eager():
    train_parity(SmallCNN, (torch.randn(4, 3, 32, 32),), steps=2, atol=2e-4)
    assert_ran_on_ort()


_PREFERRED = "PyTorch's kernel is faster than ORT's form of this op (torch_preferred_ops)"


@pytest.mark.parametrize("preferred", ["default", "none"])
def test_cnn_gradients_with_and_without_torch_preferred_ops(preferred, caplog, monkeypatch):
    """Convolution and batch-norm gradients, and the forward's convolutions (their weights are
    graph inputs in training), run in PyTorch by default (``torch_preferred_ops``), and on ORT
    (the gradients as decompositions) with ``torch_preferred_ops=()``: gradients follow eager
    both ways, and everything else of the step runs on ORT. A default choice is logged, not
    warned about."""
    options = {} if preferred == "default" else {"torch_preferred_ops": ()}
    monkeypatch.setattr(metrics, "_warned", set())  # said once per process: earlier tests said it
    with caplog.at_level(logging.INFO, logger="ort_lazy"):
        train_parity(SmallCNN, (torch.randn(4, 3, 32, 32),), steps=2, atol=2e-4, **options)
    said = [r for r in caplog.records if "aten.convolution_backward.default runs in PyTorch" in r.getMessage()]
    assert [r.levelno for r in said] == ([logging.INFO] if preferred == "default" else []), said
    c = assert_ran_on_ort()
    fallbacks = metrics.fallbacks()
    kept = {op: reasons for op, reasons in fallbacks.items() if _PREFERRED in reasons}
    if preferred == "default":
        # two convolutions and two batch norms in the backward graph, each a whole op, and the
        # forward's max pooling with indices and second convolution (the first, 3.5 MFLOP, is
        # below CONV_MIN_FLOPS: on ORT), and the pooling's gradient
        assert kept == {
            "aten.convolution.default": {_PREFERRED: 1},
            "aten.convolution_backward.default": {_PREFERRED: 2},
            "aten.native_batch_norm_backward.default": {_PREFERRED: 2},
            "aten.max_pool2d_with_indices.default": {_PREFERRED: 1},
            "aten.max_pool2d_with_indices_backward.default": {_PREFERRED: 1},
        }, fallbacks
        assert c["regions_on_ort"] >= 3, c  # forward, and the backward between the kept ops
    else:
        assert kept == {}, fallbacks
    # beyond them only BatchNorm's running-statistics updates stay in PyTorch
    assert set(fallbacks) - set(kept) <= {"aten.copy_.default"}, fallbacks


@pytest.mark.parametrize(
    ("options", "on_ort"),
    [({}, True), ({"freeze_weights": True}, True), ({"prepack_weights": False}, False), ({"torch_preferred_ops": ()}, True)],
    ids=["prepacked", "frozen", "weights-as-inputs", "nothing-preferred"],
)
def test_inference_convolutions_run_on_ort_where_ort_gets_the_weights(options, on_ort):
    """An inference convolution whose weight ORT binds as an initializer (prepacked, the
    default, or frozen) runs on ORT; one whose weight would be a graph input is preferred in
    PyTorch, as in training, when it is large enough (the second, 9.4 MFLOP; the first, 3.5, stays
    on ORT). The outputs are eager's either way."""
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x = torch.randn(4, 3, 32, 32)
    metrics.reset()
    with torch.no_grad():
        got = compile_ort(model, **options)(x)
        expected = model(x)
    assert_close(got, expected)
    assert_ran_on_ort()
    kept = metrics.fallbacks().get("aten.convolution.default", {})
    assert kept == ({} if on_ort else {_PREFERRED: 1}), metrics.fallbacks()


def test_runtime_weight_marks() -> None:
    """``mark_runtime_weights``: a convolution is marked where its weight is, or is computed
    from, a graph input and it does at least ``CONV_MIN_FLOPS``; not where the weight is a bound
    placeholder or built from constants, nor where the convolution is smaller."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ort_lazy.support import CONV_MIN_FLOPS, RUNTIME_WEIGHT, mark_runtime_weights

    def convs(x, w1, w2):
        y = torch.conv2d(torch.conv2d(x, w1), w2 * 2)  # the second weight computed from an input
        y = torch.conv2d(y, torch.ones(16, 16, 3, 3))  # a kernel of constants
        return torch.conv2d(y[:, :, :8, :8], w1)  # a small one

    x, w1, w2 = torch.randn(1, 16, 64, 64), torch.randn(16, 16, 3, 3), torch.randn(16, 16, 3, 3)
    gm = make_fx(convs)(x, w1, w2)
    nodes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    flops = [2 * n.meta["val"].numel() * 16 * 9 for n in nodes]
    assert min(flops[:3]) >= CONV_MIN_FLOPS > flops[3]
    mark_runtime_weights(gm)
    assert [n.meta[RUNTIME_WEIGHT] for n in nodes] == [True, True, False, False]
    mark_runtime_weights(gm, {2: w2})  # the second weight's input bound
    assert [n.meta[RUNTIME_WEIGHT] for n in nodes] == [True, False, False, False]


@pytest.mark.parametrize(
    ("op", "train"),
    [("aten.gelu", False), ("aten.native_layer_norm", False), ("aten.convolution_backward", True), ("aten.hardtanh_backward", True)],
)
def test_torch_executed_ops_keeps_ops_ort_lazy_decomposes(op, train):
    """An op ort-lazy (or torch) would decompose before partitioning stays whole in PyTorch
    when the user lists it: the exclusion is not lost in the decomposition."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.GELU(), torch.nn.LayerNorm(6), torch.nn.Hardtanh(), torch.nn.Flatten()
    )
    x = torch.randn(2, 3, 8, 8)
    if train:
        train_parity(lambda: copy.deepcopy(model), (x,), steps=1, torch_executed_ops=[op])
    else:
        with torch.no_grad():
            assert_close(compile_ort(copy.deepcopy(model), torch_executed_ops=[op])(x), model(x))
    assert_ran_on_ort()
    fallbacks = metrics.fallbacks()
    assert fallbacks.get(f"{op}.default") == {"excluded by the user (torch_executed_ops)": 1}, fallbacks


def test_decomposition_table_keeps_every_listed_op_whole():
    """Whatever op the AOT decomposition table would rewrite, naming it (packet or overload)
    in ``torch_executed_ops`` / ``torch_preferred_ops`` takes it out of the table."""
    from ort_lazy.lowering.decompositions import decomposition_table
    from ort_lazy.opnames import named_in, op_name

    table = decomposition_table()
    names = sorted(op_name(op) for op in table)
    assert "aten.convolution_backward.default" in names and "aten.gelu.default" in names
    for op in table:  # the table drops what ``named_in`` matches: each op by its overload and packet
        name = op_name(op)
        assert named_in(op, frozenset({name})) and named_in(op, frozenset({name.rsplit(".", 1)[0]})), name
    for name in ("aten.gelu.default", "aten.convolution_backward", names[0], names[-1]):
        kept = {op_name(op) for op in decomposition_table(None, frozenset({name}))}
        assert not {n for n in kept if n == name or n.rsplit(".", 1)[0] == name}, name
        assert len(kept) < len(names), name
    assert decomposition_table(None, frozenset(names)) == {}
    packets = frozenset(n.rsplit(".", 1)[0] for n in names)
    assert decomposition_table(None, packets) == {}


def test_tiny_gpt_forward_backward():
    torch.manual_seed(0)
    train_parity(lambda: TinyGPT(vocab=100, dim=32, heads=2, layers=1, max_len=16), (torch.randint(0, 100, (2, 16)),), steps=1)
    assert_ran_on_ort()


_lib = torch.library.Library("ortlazy_test", "DEF")
_lib.define("scale3(Tensor x) -> Tensor")


@torch.library.impl(_lib, "scale3", "CompositeExplicitAutograd")
def _scale3(x):
    return x * 3


@torch.library.register_fake("ortlazy_test::scale3")
def _scale3_fake(x):
    return torch.empty_like(x)


def test_custom_op_stays_in_pytorch_rest_on_ort():
    def f(x):
        y = torch.relu(x + 1)
        z = torch.ops.ortlazy_test.scale3(y)
        return torch.sigmoid(z * 2)

    x = torch.randn(8, 8)
    with torch.no_grad():
        out = compile_ort(f)(x)
    assert_close(out, f(x))
    c = assert_ran_on_ort(2)  # one region before, one after the custom op
    assert c["regions_on_ort"] == 2
    assert "ortlazy_test.scale3.default" in metrics.fallbacks()


def test_options_dict_through_torch_compile():
    def f(x):
        return torch.relu(x) * 2 + 1

    x = torch.randn(4)
    out = compile_ort(f, torch_executed_ops=["aten.relu"])(x)
    assert_close(out, f(x))
    assert metrics.fallbacks()["aten.relu.default"] == {"excluded by the user (torch_executed_ops)": 1}
    assert_ran_on_ort()


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_modes(mode):
    """``torch.compile(..., mode=...)`` (Inductor's modes, often passed along by habit) is
    accepted: ``max-autotune`` turns on region autotuning, the others run as the defaults."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    out = torch.compile(model, backend="ort", mode=mode)(x)
    assert_close(out, model(x))
    tuned = [k for k in metrics.timings() if k.startswith("autotune_ort:")]
    assert bool(tuned) == mode.startswith("max-autotune")
    if not tuned:
        assert_ran_on_ort()


def test_ort_lazy_compile_takes_a_mode_too():
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    assert_close(ort_lazy.compile(model, mode="max-autotune")(x), model(x))
    assert [k for k in metrics.timings() if k.startswith("autotune_ort:")]
    with pytest.raises(ort_lazy.OptionsError, match="mode: unknown value"):
        ort_lazy.compile(model, mode="fastest")


def test_unknown_compile_mode_is_a_clear_error():
    from ort_lazy.frontends.dynamo import mode_options

    with pytest.raises(ort_lazy.OptionsError, match="mode: unknown value 'fastest'"):
        mode_options("fastest")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="accepted: default, reduce-overhead"):
        torch.compile(torch.nn.Linear(2, 2), backend="ort", mode="fastest")(torch.randn(1, 2))


def test_min_block_size_keeps_small_regions_in_pytorch():
    def f(x):
        return torch.ops.ortlazy_test.scale3(x + 1) * 2

    with torch.no_grad():
        out = compile_ort(f, min_block_size=2)(torch.ones(3))
    assert torch.equal(out, f(torch.ones(3)))
    assert metrics.counters()["ort_runs"] == 0
    assert "region smaller than min_block_size" in str(metrics.fallbacks())


def test_ort_lazy_compile_convenience():
    model = SeedModel()
    x = torch.tensor([1.0, 2.0, 3.0])
    torch._dynamo.reset()
    compiled = ort_lazy.compile(model, min_block_size=1)
    assert_close(compiled(x), model(x))
    assert_ran_on_ort()


def test_dynamic_batch_one_session_serves_all_sizes():
    model = MLP(width=16, depth=1, out=4).eval()
    compiled = compile_ort(model)
    with torch.no_grad():
        for batch in (2, 3, 5, 8, 13):
            x = torch.randn(batch, 16)
            assert_close(compiled(x), model(x))
    c = assert_ran_on_ort(5)
    # batch 2 compiles static; batch 3 recompiles with a symbolic batch that then serves 5, 8, 13
    assert c["sessions_created"] == 2, c
    assert c["graphs_compiled"] == 2, c


def _linear_3d() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)
    )


class _SqueezeExcite(torch.nn.Module):
    """Convolutions with in-place activations and an in-place broadcast gate (MobileNet's
    squeeze-excitation): decompositions of in-place ops broadcast through ``expand``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.act = torch.nn.Hardswish(inplace=True)
        self.gate = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.conv(x))
        h = h.mul_(torch.sigmoid(self.gate(h.mean((2, 3), keepdim=True))))
        return h.flatten(1).mean(1, keepdim=True)


#: Models whose composite ops (linear and matmul of 3-d inputs, attention, views, flatten)
#: read sizes: name -> (model, inputs of batch b and length t). SmallCNN varies the batch only.
SYMBOLIC_CASES = {
    "linear-3d": (_linear_3d, lambda b, t: torch.randn(b, t, 16)),
    "tinygpt": (
        lambda: TinyGPT(vocab=50, dim=32, heads=2, layers=1, max_len=16),
        lambda b, t: torch.randint(0, 50, (b, t)),
    ),
    "cnn": (SmallCNN, lambda b, t: torch.randn(b, 3, 32, 32)),
    "squeeze-excite": (_SqueezeExcite, lambda b, t: torch.randn(b, 3, t, t)),
}


_SYMBOLIC_KINDS = ["inference", "inference-aotautograd", "training"]
_SYMBOLIC = [(name, kind) for kind in _SYMBOLIC_KINDS for name in SYMBOLIC_CASES]
#: every model and every kind once by default
_SYMBOLIC_FAST = [
    ("linear-3d", "training"), ("tinygpt", "inference"), ("cnn", "inference-aotautograd"), ("squeeze-excite", "training"),
]


@pytest.mark.parametrize("name,kind", tiered(_SYMBOLIC, _SYMBOLIC_FAST, unpack=True), ids=[f"{n}-{k}" for n, k in _SYMBOLIC])
def test_symbolic_dims_stay_symbolic(
    name: str, kind: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dynamic=True``: one graph and one session per region serve every size. ort-lazy adds no
    guard that fixes a dim (before, the no-grad lowering's functionalization read concrete
    sizes in ``linear`` of a 3-d input: dynamo recompiled for every new length, and after 8
    it ran the model in eager without ORT). ``inference-aotautograd`` takes the no-grad path
    through AOTAutograd that serves graphs the direct lowering cannot (it called its compiler
    inside its fake mode, where binding real weights failed and the graph ran in PyTorch)."""
    from ort_lazy.lowering import aten as lowering

    train = kind == "training"
    if kind == "inference-aotautograd":
        monkeypatch.setattr(lowering, "_inference_graph", lambda *args, **kwargs: None)
    make, inputs = SYMBOLIC_CASES[name]
    sizes = [(2, 5), (3, 7), (5, 11), (4, 9)]

    def step(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        if not train:
            with torch.no_grad():
                return [model(x)]
        out = model(x)
        out.square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return [out.detach(), *grads]

    torch.manual_seed(0)
    model = make().train(train)
    eager_frames = []
    reference = torch.compile(
        copy.deepcopy(model), backend=lambda gm, _: eager_frames.append(gm) or gm, dynamic=True
    )
    torch._dynamo.reset()
    for b, t in sizes:
        reference(inputs(b, t))
    assert len(eager_frames) == 1, "the case itself recompiles in dynamo: it cannot test ort-lazy's guards"

    metrics.reset()
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="ort", dynamic=True)
    caplog.set_level(logging.DEBUG, logger="ort_lazy")
    for b, t in sizes:
        x = inputs(b, t)
        for got, want in zip(step(compiled, x), step(model, x)):
            assert_close(got, want, rtol=1e-4, atol=1e-5)
    c = assert_ran_on_ort(len(sizes) * (2 if train else 1))
    assert c["graphs_compiled"] == (2 if train else 1), c  # forward and backward once, or the no-grad graph
    assert c["sessions_created"] == c["regions_on_ort"], c  # one session per region for every size
    assert c["ort_failures"] == 0 and c["export_failures"] == 0, c
    assert "direct inference lowering failed" not in caplog.text  # no-grad graphs skip AOTAutograd


def test_session_cache_hit_for_identical_graph():
    def f(x):
        return torch.tanh(x) * 3

    x = torch.randn(4, 4)
    compile_ort(f)(x)
    compile_ort(f)(x)  # dynamo reset: same graph exported again -> cached session
    c = metrics.counters()
    assert c["sessions_created"] == 1 and c["session_cache_hits"] >= 1, c


def test_fresh_process_without_import():
    code = textwrap.dedent(
        """
        import sys, torch
        f = torch.compile(lambda x: x * x + 1, backend="ort")
        out = f(torch.tensor([1.0, 2.0]))
        assert out.tolist() == [2.0, 5.0], out
        assert "ort_lazy" in sys.modules  # loaded through the entry point
        from ort_lazy import metrics
        assert metrics.counters()["ort_runs"] == 1, metrics.counters()
        f2 = torch.compile(lambda x: x - 1, backend="ort", options={"min_block_size": 1})
        assert f2(torch.tensor([1.0])).tolist() == [0.0]
        print("OK")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORT_LAZY_")}
    # a fork of a process that imported torch and dynamo, not ort_lazy: the entry point loads it
    result = forkserver.run([sys.executable, "-c", code], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


def test_freeze_weights_bakes_parameters_into_the_model(tmp_path):
    import onnx

    torch.manual_seed(0)
    model = MLP(width=16, depth=2, out=4).eval()
    x = torch.randn(3, 16)
    torch._dynamo.reset()
    compiled = ort_lazy.compile(model, freeze_weights=True, dump_dir=str(tmp_path))
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        assert_close(compiled(x), model(x))
    assert_ran_on_ort(2)
    (path,) = tmp_path.glob("*.onnx")
    proto = onnx.load(str(path))
    assert len(proto.graph.input) == 1  # only x: the 6 weights and biases are initializers
    assert len(proto.graph.initializer) >= 6


def test_freeze_weights_is_not_used_for_training():
    torch.manual_seed(0)
    train_parity(lambda: MLP(width=16, depth=1, out=4), (torch.randn(3, 16),), steps=2, freeze_weights=True)
    assert_ran_on_ort()


def test_no_grad_graphs_skip_aotautograd_and_keep_input_mutations():
    def f(x, buf):
        buf.add_(1)  # an in-place update of an input, kept in PyTorch
        return torch.relu(x) * buf

    x = torch.randn(5)
    buf_ref, buf_ort = torch.zeros(5), torch.zeros(5)
    compiled = compile_ort(f)
    with torch.no_grad():
        expected = f(x, buf_ref)
        actual = compiled(x, buf_ort)
        assert_close(actual, expected)
        assert torch.equal(buf_ort, buf_ref)
        compiled(x, buf_ort)
    assert buf_ort.tolist() == [2.0] * 5
    assert_ran_on_ort(2)
    assert metrics.counters()["graphs_compiled"] == 1

"""Written-out activations recognised and run as ORT's fused kernels, with eager's values.

The tanh approximation of GELU spelt in Python (GPT-2's ``NewGELUActivation``, ``FastGELU``,
BLOOM's, ``x ** 3`` or ``x * x * x``, bias added first) becomes one ``FastGelu`` node; formulas
that only look alike (another constant, another dtype, an intermediate used elsewhere, a
training graph) keep their ops. Every case compares with eager and checks ORT ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, assert_ran_on_ort, captured_exports, compile_ort
from ort_lazy import metrics
from ort_lazy.lowering.fusions import fuse_tanh_gelu

aten = torch.ops.aten
_C = math.sqrt(2.0 / math.pi)


def _ops(models: list) -> list[str]:
    return [n.op_type for m in models for n in onnx.load_from_string(m.model_bytes).graph.node]


def new_gelu(x: torch.Tensor) -> torch.Tensor:  # transformers' NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def fast_gelu(x: torch.Tensor) -> torch.Tensor:  # transformers' FastGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def bloom_gelu(x: torch.Tensor) -> torch.Tensor:  # BLOOM's bloom_gelu_forward
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def cubed_gelu(x: torch.Tensor) -> torch.Tensor:  # another order of every product and sum
    t = torch.tanh((x * x * x * 0.044715 + x) * _C)
    return (t + 1.0) * x * 0.5


def power_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * (0.5 + 0.5 * torch.tanh(_C * (x + 0.044715 * x**3)))


def biased_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # the GELU of a sum
    return new_gelu(x + bias) * 2.0


FUSED: dict[str, Callable[..., torch.Tensor]] = {
    "new": new_gelu, "fast": fast_gelu, "bloom": bloom_gelu, "cubed": cubed_gelu, "power": power_gelu,
}


def _values() -> torch.Tensor:
    # the whole range: tails where 1 + tanh cancels, infinities and NaN
    grid = torch.linspace(-12.0, 12.0, 4799)
    specials = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, float("inf"), float("-inf"), float("nan")])
    return torch.cat([grid, specials, torch.randn(2000) * 3]).reshape(-1, 8)


def _run(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> list[str]:
    """``fn`` compiled against eager (1e-6 of the largest value, NaN where eager's); the ops of
    what ran on ORT."""
    metrics.reset()
    with torch.no_grad():
        expected = fn(*args)
        with captured_exports() as models:
            got = compile_ort(fn)(*args)
    assert torch.equal(got.isnan(), expected.isnan())
    assert_close(torch.nan_to_num(got), torch.nan_to_num(expected), rtol=1e-6, atol=1e-6)
    assert_ran_on_ort()
    return _ops(models)


@pytest.mark.parametrize("name", sorted(FUSED))
def test_written_out_tanh_gelu_runs_as_one_kernel(name: str) -> None:
    ops = _run(FUSED[name], _values())
    assert ops.count("FastGelu") == 1, ops
    assert "Tanh" not in ops and "Mul" not in ops, ops


def test_gelu_of_a_sum_is_fused_after_the_sum() -> None:
    x, bias = _values(), torch.randn(8)
    ops = _run(biased_gelu, x, bias)
    assert ops.count("FastGelu") == 1 and "Tanh" not in ops, ops


def test_tanh_gelu_op_runs_as_one_kernel() -> None:
    ops = _run(lambda x: F.gelu(x, approximate="tanh"), _values())
    assert ops.count("FastGelu") == 1, ops


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.04 * torch.pow(x, 3.0)))),  # another constant
        lambda x: 0.5 * x * (1.0 + torch.tanh(0.75 * (x + 0.044715 * torch.pow(x, 3.0)))),
        lambda x: 0.4 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0)))),
        lambda x: 0.5 * x * (1.0 - torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0)))),
        lambda x: 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 2.0)))),
        lambda x: 0.5 * x.flip(0) * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0)))),  # two inputs
    ],
    ids=["cubic-coefficient", "scale", "half", "minus", "square", "other-x"],
)
def test_formulas_that_only_look_alike_keep_their_ops(fn: Callable[..., torch.Tensor]) -> None:
    ops = _run(fn, _values())
    assert "FastGelu" not in ops and "Tanh" in ops, ops


def test_an_intermediate_used_elsewhere_keeps_the_formula() -> None:
    def gelu_and_tanh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0)))
        return 0.5 * x * (1.0 + t), t

    metrics.reset()
    x = _values()
    with torch.no_grad(), captured_exports() as models:
        got = compile_ort(gelu_and_tanh)(x)
    assert_close([torch.nan_to_num(g) for g in got], [torch.nan_to_num(e) for e in gelu_and_tanh(x)], rtol=1e-6, atol=1e-6)
    assert_ran_on_ort()
    assert "FastGelu" not in _ops(models)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes_keep_the_formula_and_eager_values(dtype: torch.dtype) -> None:
    metrics.reset()
    x = (torch.randn(64, 8) * 3).to(dtype)
    with torch.no_grad(), captured_exports() as models:
        got = compile_ort(new_gelu)(x)
    expected = new_gelu(x)
    tol = 1e-12 if dtype == torch.float64 else 1e-2
    assert_close(got, expected, rtol=tol, atol=tol)
    assert_ran_on_ort()
    assert "FastGelu" not in _ops(models)


def test_training_keeps_the_formula_and_eager_gradients() -> None:
    metrics.reset()
    x = torch.randn(32, 16, requires_grad=True)
    weight = torch.randn(16, 16, requires_grad=True)

    def block(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return new_gelu(x @ weight).sum(-1)

    expected = block(x, weight)
    expected.square().sum().backward()
    grads = (x.grad.clone(), weight.grad.clone())
    x.grad = weight.grad = None
    got = compile_ort(block)(x, weight)
    got.square().sum().backward()
    assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert_close([x.grad, weight.grad], list(grads), rtol=1e-5, atol=1e-5)
    assert_ran_on_ort()


def test_fusion_replaces_only_the_formula_in_the_aten_graph() -> None:
    from helpers import aten_graph

    x = torch.randn(4, 8)
    gm = aten_graph(lambda x: new_gelu(x) + torch.tanh(x), x)
    assert fuse_tanh_gelu(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.gelu.default) == 1 and targets.count(aten.tanh.default) == 1, targets
    torch.testing.assert_close(gm(x), new_gelu(x) + torch.tanh(x), rtol=1e-6, atol=1e-6)
    assert fuse_tanh_gelu(gm) == 0


def test_gpt2_mlp_activation_runs_as_one_kernel() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16, use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    tokens = torch.randint(0, 64, (2, 8))
    metrics.reset()
    with torch.no_grad():
        expected = model(tokens).logits
        with captured_exports() as models:
            got = compile_ort(model)(tokens).logits
    assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert_ran_on_ort()
    ops = _ops(models)
    assert ops.count("FastGelu") == 2 and "Tanh" not in ops, ops


@pytest.mark.parametrize(
    ("dtype", "approximate", "fused"),
    [(torch.float32, "tanh", True), (torch.float32, "none", False), (torch.float64, "tanh", False)],
)
def test_gelu_translation_keeps_the_exporters_for_other_forms(dtype: torch.dtype, approximate: str, fused: bool) -> None:
    """An ``aten.gelu`` reaching the translator as it is (no rewrite before it): ORT's kernel
    for the float32 tanh form only, the exporter's own translation otherwise; eager's values."""
    import onnxruntime as ort

    from helpers import aten_graph
    from ort_lazy.export.fx import export_graph

    x = (torch.randn(16, 8) * 3).to(dtype)
    model = export_graph(aten_graph(lambda x: F.gelu(x, approximate=approximate), x))
    assert ("FastGelu" in _ops([model])) is fused
    session = ort.InferenceSession(model.model_bytes, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {model.input_names[0]: x.numpy()})
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert_close(torch.from_numpy(got), F.gelu(x, approximate=approximate), rtol=tol, atol=tol)


def test_fused_gelu_beside_float16_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """``precision="fp16"`` narrows the products around the fused GELU (which stays float32,
    between casts): its output keeps its own type when its input's is narrowed."""
    import functools

    from helpers import max_rel_error
    from ort_lazy.export import fx as export_fx
    from ort_lazy.export import half

    # the graph a GPU gets, on the CPU provider's cast-around kernels
    monkeypatch.setattr(export_fx, "narrow_to_float16", functools.partial(half.narrow_to_float16, exact=False))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(8, 16)
    metrics.reset()
    with torch.no_grad():
        expected = model(x)
        with captured_exports() as models:
            got = compile_ort(model, precision="fp16")(x)
    c = metrics.counters()
    assert c["ort_runs"] == 1 and not (c["export_failures"] or c["ort_failures"]), c
    assert "FastGelu" in _ops(models)
    assert 0 < max_rel_error(got, expected) < 1e-2


def test_fused_gelu_with_dynamic_shapes() -> None:
    """One symbolic graph serves three sizes, the GELU fused in it (constants spelt as numbers:
    with ``dynamic=True`` dynamo passes ``math.pi`` in as a value of the call, so NewGELU's
    ``sqrt(2 / pi)`` is computed at run time and that formula is left as it is)."""
    metrics.reset()
    torch._dynamo.reset()
    compiled = torch.compile(fast_gelu, backend="ort", dynamic=True)
    with torch.no_grad(), captured_exports() as models:
        for rows in (3, 7, 12):
            x = torch.randn(rows, 16) * 3
            assert_close(compiled(x), fast_gelu(x), rtol=1e-6, atol=1e-6)
    assert_ran_on_ort(3)
    assert len(models) == 1 and _ops(models).count("FastGelu") == 1, _ops(models)


def test_fused_gelu_beside_a_sigmoid() -> None:
    """A model holding ORT's ``FastGelu`` and a ``Sigmoid`` (which the CPU provider's exact
    rewrite parses and types: ONNX's own schemas do not know ORT's ops) runs on ORT."""
    ops = _run(lambda x: F.silu(x) * new_gelu(x), _values())
    assert "FastGelu" in ops, ops

"""``precision="fp16"``: inference regions computed in float16 where the provider has kernels.

ORT's CPU provider has no float16 matrix products or arithmetic, so on the CPU the option
leaves regions in float32 (with one warning). The narrowed graph a GPU gets is checked here
on the CPU by counting the float16 nodes ORT's CPU provider runs through its own casts
(``exact=False``): each op computed in float32 and rounded to float16, as PyTorch's CPU kernels
compute float16, so eager's float16 model is the reference for the error.
"""

from __future__ import annotations

import copy
import functools
import logging
import math

import onnx
import pytest
import torch

from helpers import assert_close, assert_ran_on_ort, captured_exports, compile_ort, max_rel_error
from ort_lazy import Options, metrics
from ort_lazy.export import fx as export_fx
from ort_lazy.export import half
from ort_lazy.export.half import FLOAT32_OPS

F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


@pytest.fixture
def gpu_like(monkeypatch):
    """Narrow as for a provider with float16 kernels wherever ORT has float32 ones."""
    monkeypatch.setattr(export_fx, "narrow_to_float16", functools.partial(half.narrow_to_float16, exact=False))


def _types(proto: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(proto)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


class _Attention(torch.nn.Module):
    """Masked attention whose mask is float32's most negative number (as Hugging Face builds
    it), with a fully masked row: float16's -inf there would give NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(32)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril().logical_not()
        mask[0, :] = True  # a row that attends to nothing
        scores = scores.masked_fill(mask, torch.finfo(torch.float32).min)
        return self.out(scores.softmax(-1) @ v)


MODELS = {
    "mlp": lambda: torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)),
    "transformer": lambda: torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
    "cnn": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ),
    "attention": _Attention,
}
INPUTS = {"mlp": (8, 64), "transformer": (2, 12, 32), "cnn": (2, 3, 12, 12), "attention": (2, 6, 32)}


@pytest.mark.parametrize("name", list(MODELS))
def test_fp16_regions_compute_in_float16_with_float32_edges(gpu_like, name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x = torch.randn(INPUTS[name])
    with torch.no_grad(), captured_exports() as models:
        expected = model(x)
        got = compile_ort(model, precision="fp16")(x)
        try:
            half_error = max_rel_error(model.half()(x.half()), expected)
        except RuntimeError:  # float32's minimum does not fit eager's float16 (the mask)
            half_error = 1e-3
        model.float()
    assert_ran_on_ort()
    assert metrics.counters()["fallback_ops"] == 0, metrics.fallbacks()
    assert got.dtype == torch.float32 and not got.isnan().any()
    # about eager's own float16 error, and small
    error = max_rel_error(got, expected)
    assert error < max(3 * half_error, 2e-3) and error < 1e-2, (error, half_error)
    (exported,) = models
    proto = onnx.load_from_string(exported.model_bytes)
    types = _types(proto)
    g = proto.graph
    # the region's edges stay float32; its products compute in float16
    assert all(v.type.tensor_type.elem_type != F16 for v in [*g.input, *g.output])
    products = [n for n in g.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    assert products and all(types.get(n.output[0]) == F16 for n in products), [(n.op_type, types.get(n.output[0])) for n in products]
    # what float16 cannot hold stays float32
    kept = [n for n in g.node if n.op_type in FLOAT32_OPS - {"Cast", "Constant", "ConstantOfShape", "CastLike"}]
    assert all(types.get(n.output[0]) != F16 for n in kept), [n.op_type for n in kept]
    # no weight carried twice: every float32 initializer left is read in float32
    readers = {name: [n for n in g.node if name in n.input] for name in (i.name for i in g.initializer)}
    for init in g.initializer:
        if init.data_type == F32 and init.dims:
            assert readers[init.name], init.name


def test_fp16_constants_are_clipped_to_the_float16_range(gpu_like) -> None:
    """float32 constants beyond float16's range (``finfo.min`` of attention masks, a clamp's
    bound) become float16's largest finite value, not an infinity; infinities and ordinary
    values stay."""
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    lin = torch.nn.Linear(6, 3)
    lin.bias.data = torch.tensor([-3.0e38, float("-inf"), 0.5])  # baked with the weights
    model = lambda t: lin(t).clamp(-1e6, 1e6)  # noqa: E731
    with torch.no_grad(), captured_exports() as models:
        got = compile_ort(model, precision="fp16")(x)
        expected = model(x)
    assert_ran_on_ort()
    # -3e38 and -inf: below the clamp's bound, which is clipped to float16's range
    assert (got[:, 0] == -65504).all() and (got[:, 1] == -65504).all(), got
    assert_close(got[:, 2], expected[:, 2], rtol=1e-2, atol=1e-2)
    proto = onnx.load_from_string(models[0].model_bytes)
    values = [onnx.numpy_helper.to_array(i) for i in proto.graph.initializer if i.data_type == F16]
    assert any((v == -math.inf).any() for v in values), values  # -inf itself stays
    assert any((v == 65504).any() for v in values), values


def test_fp16_follows_weight_changes(gpu_like) -> None:
    torch.manual_seed(0)
    model = MODELS["mlp"]().eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        compiled = compile_ort(model, precision="fp16")
        assert max_rel_error(compiled(x), model(x)) < 1e-2
        model[2].bias.add_(1.0)
        assert max_rel_error(compiled(x), model(x)) < 1e-2
    assert metrics.counters()["weight_refreshes"] == 1
    assert_ran_on_ort(2)


def test_fp16_on_the_cpu_provider_stays_float32_with_a_warning(caplog, monkeypatch) -> None:
    """ORT's CPU provider has float16 kernels only for moving values (no products, no
    arithmetic): narrowing would add casts and gain nothing, so the region stays float32."""
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(48, 4, 96, dropout=0.0, batch_first=True).eval()  # not compiled above
    x = torch.randn(2, 10, 48)
    monkeypatch.setattr(metrics, "_warned", set())  # given even if an earlier test saw it
    with torch.no_grad(), captured_exports() as models, caplog.at_level(logging.WARNING, logger="ort_lazy"):
        assert_close(compile_ort(model, precision="fp16")(x), model(x))
    assert_ran_on_ort()
    types = _types(onnx.load_from_string(models[0].model_bytes))
    assert F16 not in types.values()
    said = [r.getMessage() for r in caplog.records if "precision='fp16'" in r.getMessage()]
    assert len(said) == 1 and "CPUExecutionProvider" in said[0] and "runs in float32" in said[0], said


def test_fp16_leaves_other_dtypes_alone_without_a_warning(caplog, monkeypatch, gpu_like) -> None:
    """Only float32 is narrowed: a float64 model computes in float64 (eager's values exactly
    enough for float64) and nothing warns about float16 kernels."""
    torch.manual_seed(0)
    model = MODELS["mlp"]().double().eval()
    x = torch.randn(8, 64, dtype=torch.float64)
    monkeypatch.setattr(metrics, "_warned", set())
    with torch.no_grad(), captured_exports() as models, caplog.at_level(logging.WARNING, logger="ort_lazy"):
        assert_close(compile_ort(model, precision="fp16")(x), model(x), rtol=1e-12, atol=1e-12)
    assert_ran_on_ort()
    assert all(F16 not in _types(onnx.load_from_string(m.model_bytes)).values() for m in models)
    assert not [r for r in caplog.records if "precision='fp16'" in r.getMessage()]


def test_explain_reports_the_fp16_error(gpu_like) -> None:
    import ort_lazy

    torch.manual_seed(0)
    model = MODELS["mlp"]().eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        report = ort_lazy.explain(model, x, precision="fp16")
    acc = report.as_dict()["accuracy"]
    assert acc["precision"] == "fp16" and 0 < acc["max_rel_error"] < 1e-2, acc


def test_fp16_is_an_accepted_precision() -> None:
    assert Options(precision="FP16").precision == "fp16"


@pytest.mark.parametrize("precision", ["fp16", "int8-dynamic"])
def test_reduced_precision_leaves_training_graphs_alone_and_says_so(caplog, monkeypatch, gpu_like, precision) -> None:
    """A reduced precision is for inference: a training step keeps eager's float32 values and
    gradients (nothing narrowed or quantized), with one warning that says why."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))
    ref = copy.deepcopy(model)
    x = torch.randn(6, 24)
    monkeypatch.setattr(metrics, "_warned", set())
    with captured_exports() as models, caplog.at_level(logging.WARNING, logger="ort_lazy"):
        compile_ort(model, precision=precision)(x).square().mean().backward()
    ref(x).square().mean().backward()
    assert_ran_on_ort(2)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.grad, q.grad)
    for exported in models:
        proto = onnx.load_from_string(exported.model_bytes)
        assert F16 not in _types(proto).values()
        assert not {n.op_type for n in proto.graph.node} & {"MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear"}
    said = [r.getMessage() for r in caplog.records if "applies to inference graphs" in r.getMessage()]
    assert len(said) == 1 and precision in said[0], said


def _pooling_cnn() -> torch.nn.Module:
    """Max pooling over 112 x 112 maps: large enough that the NaN rule's positions stay a
    computation inside its ``If`` branch, which reads the map's shape from the graph around it."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1),
        torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(256, 10),
    ).eval()


@pytest.mark.usefixtures("exact_forms")
@pytest.mark.parametrize("precision", ["fp16", "int8-dynamic"])
def test_reduced_precision_keeps_the_values_if_branches_read(gpu_like, precision) -> None:
    """Each reduced precision rewrites the exported model; a rewrite that drops a value only an
    ``If`` branch reads (it looked at the top-level graph alone) left an invalid model, and
    every CNN with max pooling ran in PyTorch under ``int8-dynamic``."""
    model = _pooling_cnn()
    x = torch.randn(2, 3, 114, 114)
    metrics.reset()
    with torch.no_grad(), captured_exports() as models:
        got = compile_ort(model, precision=precision)(x)
        expected = model(x)
    assert_ran_on_ort()
    assert not metrics.counters()["export_failures"]
    (exported,) = models
    proto = onnx.load_from_string(exported.model_bytes)
    ops = {n.op_type for n in proto.graph.node}
    assert "If" in ops, ops  # the case the test is for
    if precision == "fp16":
        assert F16 in _types(proto).values()
    else:
        assert ops & {"MatMulInteger", "DynamicQuantizeMatMul"}, ops
    assert 0 < max_rel_error(got, expected) < 0.05

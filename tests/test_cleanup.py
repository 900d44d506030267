"""The shape-level clean-up of exported regions (``export.cleanup``): fewer nodes, same numbers.

Linear layers on 3-D tensors, head splits and transposes that cancel export without the
reshape chains and copies the aten graph spells; weights shared with torch tensors are never
read or folded; the onnxscript rules left out on purpose (they change numbers) stay out. Every
case compares with eager and checks ORT ran.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

from helpers import assert_close, assert_ran_on_ort, bridge_marks, captured_exports, compile_ort
from ort_lazy import metrics
from ort_lazy.export import cleanup
from ort_lazy.models import BUILTIN


def _graphs(models: list) -> list[onnx.GraphProto]:
    return [onnx.load_from_string(m.model_bytes).graph for m in models]


def _chained_reshapes(graph: onnx.GraphProto) -> list[str]:
    """Reshapes whose input another Reshape made."""
    made = {o: n.op_type for n in graph.node for o in n.output}
    return [n.name for n in graph.node if n.op_type == "Reshape" and made.get(n.input[0]) == "Reshape"]


def _reshaped_products(graph: onnx.GraphProto) -> list[str]:
    """MatMul nodes read through a Reshape and reshaped again: what broadcasting makes redundant."""
    made = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out = []
    for n in graph.node:
        if n.op_type != "MatMul":
            continue
        source = made.get(n.input[0])
        if source is not None and source.op_type == "Reshape" and any(r.op_type == "Reshape" for r in readers.get(n.output[0], [])):
            out.append(n.name)
    return out


class _Heads(nn.Module):
    """A linear layer on [B, T, C] whose result is split into heads and transposed back."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        y = self.proj(x).view(b, t, 4, c // 4).transpose(1, 2)
        return y.transpose(1, 2).reshape(b, t, c) * 2


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_linear_on_3d_and_head_split_export_without_reshape_chains(training: bool) -> None:
    """Before: view -> mm -> view -> view (heads) was Reshape, MatMul, Reshape, Reshape, and the
    two transposes a Transpose pair; now a 3-D MatMul and at most one Reshape after it. (The
    backward keeps the 2-D view its weight gradient reads too.)"""
    torch.manual_seed(0)
    model = _Heads()
    x = torch.randn(2, 10, 32, requires_grad=training)
    with captured_exports() as models:
        got = compile_ort(model)(x)
        if training:
            got.sum().backward()
    assert_ran_on_ort()
    expected = model(x)
    assert_close(got, expected)
    if training:
        grad = x.grad.clone()
        x.grad = None
        expected.sum().backward()
        assert_close(grad, x.grad)
    assert models
    for m, graph in zip(models, _graphs(models)):
        assert _chained_reshapes(graph) == [], m.name
        if not m.name.startswith("backward"):
            assert _reshaped_products(graph) == [], m.name
        made = {o: n.op_type for n in graph.node for o in n.output}
        assert not [n.name for n in graph.node if n.op_type == "Transpose" and made.get(n.input[0]) == "Transpose"]


@pytest.mark.parametrize("name", ["transformer", "gpt"])
def test_builtin_models_export_without_reshape_chains(name: str) -> None:
    """nn.TransformerEncoderLayer and the built-in decoder: every region free of reshape chains,
    eager's outputs."""
    torch.manual_seed(0)
    entry = BUILTIN[name]
    model = entry.make().eval()
    inputs = entry.inputs()
    with captured_exports() as models, torch.no_grad():
        got = compile_ort(model)(*inputs)
        expected = model(*inputs)
    assert_ran_on_ort()
    assert_close(got, expected)
    for graph in _graphs(models):
        assert _chained_reshapes(graph) == []
        assert _reshaped_products(graph) == []
    assert metrics.timings()["cleanup"]["count"] >= 1


def test_shared_weights_are_neither_read_nor_folded() -> None:
    """A small weight (under the folder's size limit) in an expression of constants stays an
    external initializer read from the parameter's memory: an in-place change gives the new
    result, and no folded copy of it is left in the model."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8).eval()

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ (self.lin.weight * 2).t().t().t() + self.lin.bias

    scaled = Scaled()
    x = torch.randn(4, 8)
    with captured_exports() as models, torch.no_grad():
        compiled = compile_ort(scaled)
        assert_close(compiled(x), scaled(x))
        model.weight.mul_(-3)
        assert_close(compiled(x), scaled(x))
    c = assert_ran_on_ort(2)
    assert c["export_failures"] == 0 and c["fallback_ops"] == 0
    external = [m for m in models if m.external]
    assert external, "the weights were not shared"
    for m in external:
        graph = onnx.load_from_string(m.model_bytes).graph
        kept = {i.name for i in graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
        assert set(m.external) <= kept


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4 else torch.int64)


#: graphs an onnxscript rule would change the numbers of (the rule is left out of the clean-up)
_LEFT_OUT = {
    # Cast(Cast(x, float), float16) -> Cast(x, float16): eager rounds twice (1 + 2^-11 + 2^-40
    # is 1.0 through float32, 1.0009765625 directly)
    "cast-cast": (lambda x: x.float().half(), torch.tensor([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 3.0], dtype=torch.float64)),
    # x + 0 -> x: -0.0 + 0.0 is +0.0
    "add-0": (lambda x: x + 0.0, torch.tensor([-0.0, 0.0, -1.5])),
    # Min(Max(x, lo), hi) -> Clip: NaN stays NaN in eager's maximum/minimum
    "min-max": (lambda x: torch.minimum(torch.maximum(x, torch.tensor(-1.0)), torch.tensor(1.0)), torch.tensor([float("nan"), -3.0, 0.5, 3.0])),
}


@pytest.mark.parametrize("name", list(_LEFT_OUT))
def test_rules_that_change_numbers_stay_out(name: str) -> None:
    fn, x = _LEFT_OUT[name]
    got = compile_ort(fn)(x)
    assert_ran_on_ort()
    expected = fn(x)
    assert got.dtype == expected.dtype
    assert torch.equal(_bits(got), _bits(expected)), (got, expected)
    assert not {"cast_cast_rule", "add_0_rule", "min_max_rule", "max_min_rule"} & set(cleanup.RULE_NAMES)


def test_every_named_rule_exists_in_this_onnxscript() -> None:
    """A rule renamed by an onnxscript release would silently drop out of the clean-up."""
    assert len(cleanup._rules()) == len(cleanup.RULE_NAMES)


def test_a_failing_clean_up_keeps_the_region_on_ort(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A fault inside onnxscript's passes is counted and warned once; the region runs on ORT as
    exported, with eager's values, and no export fails."""
    import logging

    import onnxscript.optimizer

    def broken(*args, **kwargs):
        raise RuntimeError("injected clean-up fault")

    monkeypatch.setattr(onnxscript.optimizer, "fold_constants", broken)
    torch.manual_seed(0)
    model = _Heads()
    x = torch.randn(2, 10, 32)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"), torch.no_grad():
        compiled = compile_ort(model)
        assert_close(compiled(x), model(x))
        y = torch.randn(3, 10, 32)  # another graph: a second failing clean-up, no second warning
        assert_close(compiled(y), model(y))
    c = assert_ran_on_ort(2)
    assert c["cleanup_failures"] >= 2 and c["export_failures"] == 0 and c["fallback_ops"] == 0
    warned = [r for r in caplog.records if "clean-up" in r.getMessage()]
    assert len(warned) == 1 and "injected clean-up fault" in warned[0].getMessage()


def _heads(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b = a @ w.t()
    return b.view(2, 10, 4, 16).transpose(1, 2).transpose(1, 2).reshape(2, 10, 64) * 2.0


def test_torchscript_groups_are_cleaned_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TorchScript front door's groups (exported by the TorchScript exporter) get the same
    clean-up: the head split's Reshape pair becomes one and the cancelling transposes go."""
    import ort_lazy.jit
    from ort_lazy.frontends import jit as jit_frontend

    exported: list = []
    real = jit_frontend.export_torchscript

    def spy(*args, **kwargs):
        model = real(*args, **kwargs)
        exported.append(model)
        return model

    monkeypatch.setattr(jit_frontend, "export_torchscript", spy)
    scripted = torch.jit.script(_heads)
    x, w = torch.randn(2, 10, 64), torch.randn(64, 64)
    with ort_lazy.jit.enable():
        outs = [scripted(x, w) for _ in range(3)]
    assert_ran_on_ort()
    for out in outs:
        assert_close(out, _heads(x, w))
    assert exported
    for graph in _graphs(exported):
        made = {o: n.op_type for n in graph.node for o in n.output}
        assert _chained_reshapes(graph) == []
        assert not [n.name for n in graph.node if n.op_type == "Transpose" and made.get(n.input[0]) == "Transpose"]


for _mark in bridge_marks():  # the TorchScript front door needs the compiled bridge
    test_torchscript_groups_are_cleaned_too = _mark(test_torchscript_groups_are_cleaned_too)

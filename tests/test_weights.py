"""Parameters of inference graphs as ORT initializers: shared memory, never stale; int8 precision."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
import torch

from helpers import assert_close, assert_ran_on_ort, captured_exports, compile_ort, take_sessions
from ort_lazy import Options, OptionsError, metrics


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def test_inference_weights_are_initializers_on_the_parameters_memory(monkeypatch) -> None:
    from ort_lazy.runtime import _ort

    viewed: list[int] = []
    real = _ort.ortvalue_of
    monkeypatch.setattr(_ort, "ortvalue_of", lambda t: viewed.append(t.data_ptr()) or real(t))
    model = _mlp()
    x = torch.randn(5, 16)
    with torch.no_grad(), captured_exports() as models:
        assert_close(compile_ort(model)(x), model(x))
    assert_ran_on_ort()
    (exported,) = models
    proto = onnx.load_from_string(exported.model_bytes)
    # the weights are initializers without data in the model, bound to the tensors themselves
    assert len(exported.external) == 4
    assert len(proto.graph.input) == 1 and len(proto.graph.initializer) >= 4
    assert all(i.data_location == onnx.TensorProto.EXTERNAL for i in proto.graph.initializer if i.name in exported.external)
    assert sorted(viewed) == sorted(p.data_ptr() for p in model.parameters())


@pytest.mark.parametrize("change", ["in_place", "optimizer_step", "load_state_dict"])
def test_a_changed_parameter_is_never_stale(change: str) -> None:
    model = _mlp()
    x = torch.randn(5, 16)
    compiled = compile_ort(model)
    take_sessions()
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    if change == "in_place":
        with torch.no_grad():
            model[0].weight.mul_(1.5)
    elif change == "optimizer_step":
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model(x).sum().backward()
        opt.step()
    else:
        state = {k: v * 0.5 for k, v in model.state_dict().items()}
        model.load_state_dict(state)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        assert_close(compiled(x), model(x))
    c = metrics.counters()
    assert c["weight_refreshes"] == 1 and c["ort_runs"] == 3, c
    # the session of the old weights (and ORT's prepacked copy of them) is not kept
    assert len(take_sessions()) == 1


def _conv_bn() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    with torch.no_grad():  # statistics that are not the identity, so folding them matters
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model


def test_buffers_are_initializers_too_and_never_stale() -> None:
    model = _conv_bn().eval()
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad(), captured_exports() as models:
        compiled = compile_ort(model)
        assert_close(compiled(x), model(x))
        # batch norm's running statistics are buffers: initializers ORT folds into the conv
        (exported,) = models
        assert len(exported.input_names) == 1, exported.input_names
        assert len(exported.external) == 6  # conv weight/bias, bn weight/bias/mean/var
        model[1].running_var.mul_(3.0)
        assert_close(compiled(x), model(x))
    assert_ran_on_ort()
    assert metrics.counters()["weight_refreshes"] == 1


def test_buffers_written_by_the_graph_stay_inputs() -> None:
    """Train-mode batch norm under no_grad updates its statistics: they stay graph inputs,
    updated as eager updates them, and no session is rebuilt per call."""
    model, reference = _conv_bn().train(), _conv_bn().train()
    x = torch.randn(2, 3, 10, 10)
    compiled = compile_ort(model)
    with torch.no_grad():
        for _ in range(3):
            assert_close(compiled(x), reference(x))
    assert_close(model[1].running_mean, reference[1].running_mean)
    assert_close(model[1].running_var, reference[1].running_var)
    assert int(model[1].num_batches_tracked) == 3
    assert metrics.counters()["weight_refreshes"] == 0


def test_prepack_off_passes_weights_as_inputs() -> None:
    model = _mlp()
    x = torch.randn(5, 16)
    with torch.no_grad(), captured_exports() as models:
        compiled = compile_ort(model, prepack_weights=False)
        assert_close(compiled(x), model(x))
        model[0].weight.mul_(2.0)
        assert_close(compiled(x), model(x))
    assert not models[0].external and len(models[0].input_names) == 5
    assert metrics.counters()["weight_refreshes"] == 0


def test_frozen_weights_are_a_snapshot() -> None:
    model = _mlp()
    x = torch.randn(5, 16)
    with torch.no_grad():
        compiled = compile_ort(model, freeze_weights=True)
        before = model(x)
        assert_close(compiled(x), before)
        model[0].weight.mul_(2.0)
        assert_close(compiled(x), before)  # explicitly snapshot at compile time


def test_int8_dynamic_precision_quantizes_weight_products_and_follows_changes() -> None:
    torch.manual_seed(0)
    ffn = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(16, 256)
    with torch.no_grad(), captured_exports() as models:
        compiled = compile_ort(ffn, precision="int8-dynamic")
        expected = ffn(x)
        got = compiled(x)
        assert float((got - expected).abs().max() / expected.abs().max()) < 0.05
        ops = {n.op_type for n in onnx.load_from_string(models[0].model_bytes).graph.node}
        assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops or "DynamicQuantizeMatMul" in ops, ops
        ffn[2].bias.add_(1.0)
        expected = ffn(x)
        got = compiled(x)
        assert float((got - expected).abs().max() / expected.abs().max()) < 0.05
    assert metrics.counters()["weight_refreshes"] == 1
    assert_ran_on_ort(2)


class _BatchedProducts(torch.nn.Module):
    """A product with a constant batch of matrices (as DeBERTa's folded relative positions
    give), then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = torch.nn.Parameter(torch.randn(4, 16, 16) / 4)
        self.out = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.matmul(x, self.heads))


def test_int8_dynamic_keeps_products_with_a_batch_of_constant_matrices_in_float32() -> None:
    """ORT's quantized product takes per-channel scales for a 2-D weight only: a quantized 3-D
    one failed at run time and the region ran in PyTorch from then on."""
    model = _BatchedProducts().eval()
    x = torch.randn(2, 4, 8, 16)
    metrics.reset()
    with torch.no_grad(), captured_exports() as models:
        compiled = compile_ort(model, precision="int8-dynamic")
        for _ in range(2):
            got = compiled(x)
        expected = model(x)
    assert_ran_on_ort(2)
    assert not metrics.counters()["ort_failures"] and not metrics.counters()["torch_runs"]
    nodes = onnx.load_from_string(models[0].model_bytes).graph.node
    ops = [n.op_type for n in nodes]
    assert "MatMul" in ops and ({"MatMulInteger", "DynamicQuantizeMatMul"} & set(ops)), ops
    assert float((got - expected).abs().max() / expected.abs().max()) < 0.05


def test_precision_is_validated() -> None:
    assert Options(precision="INT8-dynamic").precision == "int8-dynamic"
    with pytest.raises(OptionsError, match="precision"):
        Options(precision="int4")


def test_training_graphs_keep_weights_as_inputs() -> None:
    model = _mlp().train()
    x = torch.randn(5, 16)
    with captured_exports() as models:
        out = compile_ort(model)(x)
        out.sum().backward()
    assert models and all(not m.external for m in models)


def test_explain_reports_the_accuracy_of_a_reduced_precision() -> None:
    import ort_lazy

    torch.manual_seed(0)
    ffn = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).eval()
    x = torch.randn(8, 128)
    with torch.no_grad():
        report = ort_lazy.explain(ffn, x, precision="int8-dynamic")
    acc = report.as_dict()["accuracy"]
    assert acc["precision"] == "int8-dynamic" and 0 < acc["max_rel_error"] < 0.05, acc
    assert "precision int8-dynamic" in str(report)
    assert ort_lazy.explain(ffn, x).accuracy is None


def _instances(n: int) -> list[torch.nn.Module]:
    """``n`` modules of one class with different weights (dynamo compiles one graph for all)."""
    models = []
    for seed in range(n):
        torch.manual_seed(100 + seed)
        models.append(
            torch.nn.Sequential(
                torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 5)
            ).eval()
        )
    for m in models:  # running statistics of their own too
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    return models


WEIGHT_OPTIONS = {
    "shared": {},
    "inputs": {"prepack_weights": False},
    "snapshot": {"freeze_weights": True},
    "copied-int8": {"precision": "int8-dynamic"},
    "gpu-copied": {},  # the GPU's choice, taken on CPU tensors (device check patched)
}


@pytest.mark.parametrize("mode", list(WEIGHT_OPTIONS))
@pytest.mark.parametrize("path", ["direct", "aot"])
def test_each_module_instance_computes_with_its_own_weights(monkeypatch, mode: str, path: str) -> None:
    """One compiled graph serves every instance of a module class: each call must use the weights
    of the instance it is called with, however the graph binds weights, also past the number of
    instances that get graphs of their own, on both inference lowerings."""
    from ort_lazy.lowering import aten as aten_mod

    if mode == "gpu-copied":
        monkeypatch.setattr(aten_mod, "_inputs_device_type", lambda inputs: "cuda")
    if path == "aot":  # the direct no-grad lowering declined: AOTAutograd's inference graph
        monkeypatch.setattr(aten_mod, "_inference_graph", lambda *a, **k: None)
    torch._dynamo.reset()  # graphs compiled here, under this test's patches
    monkeypatch.setattr(aten_mod, "MAX_WEIGHT_SETS", 3)
    models = _instances(aten_mod.MAX_WEIGHT_SETS + 2)
    x = torch.randn(2, 3, 8, 8)
    compiled = [torch.compile(m, backend="ort", options=WEIGHT_OPTIONS[mode] or None) for m in models]
    tol = {"rtol": 0.05, "atol": 0.05} if mode == "copied-int8" else {}
    with torch.no_grad():
        for _ in range(2):  # each instance again after the others
            for model, fn in zip(models, compiled):
                assert_close(fn(x), model(x), **tol)
    c = assert_ran_on_ort()
    assert c["graphs_compiled"] >= 1 and c["compile_failures"] == 0
    if mode != "inputs":  # graphs that bind weights: one per instance up to the limit
        assert c["weight_sets"] == aten_mod.MAX_WEIGHT_SETS - 1


def test_regional_compilation_of_a_layer_stack() -> None:
    """Each layer of a stack compiled on its own (regional compilation): dynamo serves all the
    layers with one graph; every layer computes with its own weights, the first
    ``MAX_WEIGHT_SETS`` with them bound, the rest with them as inputs."""
    from ort_lazy.lowering import aten as aten_mod

    torch._dynamo.reset()
    torch.manual_seed(0)
    layers = [
        torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
        for _ in range(aten_mod.MAX_WEIGHT_SETS + 2)
    ]
    compiled = [torch.compile(layer, backend="ort") for layer in layers]
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected, actual = x, x
        for layer, fn in zip(layers, compiled):
            expected, actual = layer(expected), fn(actual)
            assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    c = assert_ran_on_ort()
    assert c["weight_sets"] == aten_mod.MAX_WEIGHT_SETS - 1 and c["compile_failures"] == 0
    # one export serves every bound set (the model holds no weights), one more the inputs graph
    assert metrics.timings()["export"]["count"] <= 2


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_channels_last_model_runs_on_ort(train: bool) -> None:
    """A channels-last CNN (weights and input in that layout, the usual fast CNN set-up):
    ORT views only contiguous memory, so such weights were given to the session as they were
    and the whole graph fell back; now contiguous copies are bound. Same results as eager."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3),
    ).to(memory_format=torch.channels_last).train(train)
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3, 16, 16).to(memory_format=torch.channels_last)
    compiled = torch.compile(model, backend="ort")
    with torch.set_grad_enabled(train):
        out, expected = compiled(x), reference(x)
        assert_close(out.detach(), expected.detach())
        if train:
            out.square().sum().backward()
            expected.square().sum().backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        else:
            model[0].weight.mul_(0.5)  # the region follows the weight, not its contiguous copy
            reference[0].weight.mul_(0.5)
            assert_close(compiled(x), reference(x))
    c = assert_ran_on_ort()
    assert c["ort_failures"] == 0 and c["export_failures"] == 0 and c["compile_failures"] == 0, metrics.fallbacks()


def test_replaced_parameter_objects_and_copies_use_their_own_weights() -> None:
    """Parameter objects replaced (``load_state_dict(assign=True)``, a new ``nn.Parameter``) and a
    deep copy of the compiled model: each call computes with the weights the module holds then."""
    import copy

    torch._dynamo.reset()
    model = _mlp()
    source = copy.deepcopy(model)
    for p in source.parameters():
        p.data.normal_()
    x = torch.randn(3, 16)
    compiled = torch.compile(model, backend="ort")
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        model.load_state_dict(source.state_dict(), assign=True)
        assert_close(compiled(x), model(x))
        model[0].weight = torch.nn.Parameter(torch.randn(32, 16))
        assert_close(compiled(x), model(x))
        twin = copy.deepcopy(compiled)
        for p in twin.parameters():
            p.mul_(-1)
        assert_close(twin(x), twin._orig_mod(x))
        assert_close(compiled(x), model(x))
    assert assert_ran_on_ort()["weight_sets"] == 3


def test_instances_from_many_threads_build_each_set_once() -> None:
    """Threads meeting a new module instance together: one build per instance, every result
    that instance's."""
    import threading

    torch._dynamo.reset()
    models = _instances(4)
    compiled = [torch.compile(m, backend="ort") for m in models]
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        compiled[0](x)
    errors: list[Any] = []

    def work(start: int) -> None:
        try:
            with torch.no_grad():
                for i in range(12):
                    k = (start + i) % len(models)
                    diff = float((compiled[k](x) - models[k](x)).abs().max())
                    if diff > 1e-4:
                        errors.append((k, diff))
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert assert_ran_on_ort()["weight_sets"] == len(models) - 1


@pytest.mark.parametrize("precision", ["fp32", "int8-dynamic"])
@pytest.mark.parametrize("path", ["module", "function"])
def test_weights_made_in_inference_mode_run_on_ort_and_are_never_stale(precision: str, path: str) -> None:
    """Tensors made under ``torch.inference_mode()`` have no version counter to follow: they
    are graph inputs (the region ran in PyTorch before), and a write into one is seen."""
    with torch.inference_mode():
        model = _conv_bn().eval()
        x = torch.randn(2, 3, 10, 10)
        # a module, or a function whose graph holds the module's tensors
        run = model if path == "module" else (lambda x: model(x) * 2)
        compiled = compile_ort(run, precision=precision)
        assert_close(compiled(x), run(x))
        model[0].weight.mul_(1.5)  # no version counter moves
        model[1].running_var.add_(1.0)
        assert_close(compiled(x), run(x))
        assert_close(compiled(x), run(x))
    c = assert_ran_on_ort(3)
    assert not c.get("ort_failures") and not c.get("compile_failures") and not c.get("torch_runs"), c

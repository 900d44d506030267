"""Execution providers as users name them, the form of the regions each reads, plugin EPs,
the kernel list of other flavours, and ORT's record of which provider ran each node.

Everything here runs on the standard onnxruntime (CPU provider). A region written for a
compiling provider (OpenVINO) is checked for the form its reader needs and run on ORT's CPU
provider, which ORT gives what a listed provider is missing: eager's numbers prove the form
computes the same thing. ``tests/models/test_openvino.py`` runs the same models on OpenVINO
itself in that flavour's environment.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import onnx
import pytest
import torch

from helpers import assert_close, captured_exports
from ort_lazy import explain, metrics
from ort_lazy.frontends.settings import resolve_options
from ort_lazy.options import Options, OptionsError, canonical_provider
from ort_lazy.partition import training_options
from ort_lazy.runtime import providers as eps

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"


# --------------------------------------------------------------------------- names and options


def test_short_names_and_provider_option_keys() -> None:
    o = Options(providers="OpenVINO, cpu ,openvino", provider_options={"ov": {"device_type": "CPU"}, "cuda": {"device_id": 1}})
    assert o.providers == (OPENVINO, CPU)  # canonical, each once, in the order given
    assert o.provider_options == {OPENVINO: {"device_type": "CPU"}, "CUDAExecutionProvider": {"device_id": 1}}
    assert Options(providers="trt,cuda,cpu").providers == ("TensorrtExecutionProvider", "CUDAExecutionProvider", CPU)
    assert Options(providers=["qnn", "coreml", "dml"]).providers == (
        "QNNExecutionProvider", "CoreMLExecutionProvider", "DmlExecutionProvider",
    )


@pytest.mark.parametrize(
    "options,words",
    [
        ({"providers": "opnvino"}, ["unknown execution provider 'opnvino'", "did you mean 'openvino'"]),
        ({"providers": ","}, ["at least one execution provider"]),
        ({"provider_options": {"cpu": 3}}, ["'cpu' must map to a dict"]),
        ({"ep_device": "tpu"}, ["ep_device", "cpu, gpu, npu"]),
        ({"ep_policy": "fastest"}, ["ep_policy", "prefer_gpu"]),
        ({"ep_libraries": {"X": ""}}, ["ep_libraries", "must name a library"]),
    ],
)
def test_bad_provider_settings_are_clear_errors(options: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(OptionsError) as e:
        Options(**options)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


@pytest.mark.parametrize(
    "provider,words",
    [
        ("openvino", ["onnxruntime-openvino", "build.py --use_openvino", "onnxruntime-ep-openvino"]),
        ("tensorrt", ["onnxruntime-gpu", "--use_cuda"]),
        ("qnn", ["onnxruntime-qnn"]),
    ],
)
def test_a_provider_the_flavour_lacks_says_how_to_get_it(provider: str, words: list[str]) -> None:
    if canonical_provider(provider) in __import__("onnxruntime").get_available_providers():
        pytest.skip(f"{provider} is installed here")
    with pytest.raises(OptionsError) as e:
        resolve_options({"providers": provider})
    for word in words:
        assert word in str(e.value), (word, str(e.value))


# --------------------------------------------------------------------------- the form of regions


def test_region_form_per_provider_list() -> None:
    cpu = eps.region_form((CPU,))
    assert cpu.own and cpu.contrib_ops and cpu.fused_attention and cpu.host_outputs
    assert not (cpu.inline_functions or cpu.typed_values or cpu.static_shapes) and cpu.max_opset is None
    assert eps.region_form(None) == cpu
    cuda = eps.region_form(("CUDAExecutionProvider", CPU))
    assert cuda.own and not cuda.host_outputs  # no check outputs to read from a GPU
    ov = eps.region_form((OPENVINO, CPU))
    assert not ov.own and not ov.contrib_ops and not ov.fused_attention
    assert ov.inline_functions and ov.typed_values and ov.host_outputs and ov.max_opset == 22
    trt = eps.region_form(("TensorrtExecutionProvider", "CUDAExecutionProvider", CPU))
    # TensorRT's parser reads no contrib op: one would split its engine (the CUDA provider runs it)
    assert not trt.own and not trt.contrib_ops and trt.typed_values and not trt.host_outputs
    assert eps.region_form(("CoreMLExecutionProvider", CPU)).static_shapes
    unknown = eps.region_form(("SomeNewExecutionProvider", CPU))  # the strictest form
    assert not unknown.own and not unknown.contrib_ops and unknown.typed_values
    assert eps.kernel_providers((OPENVINO, CPU)) == [CPU]
    assert eps.kernel_providers(("TensorrtExecutionProvider", "CUDAExecutionProvider", CPU)) == [
        "CUDAExecutionProvider", CPU,
    ]


@pytest.fixture
def openvino_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenVINO provider listed as installed: regions are written for it, and ORT, which
    does not have it, runs them on its CPU provider."""
    import onnxruntime

    real = onnxruntime.get_available_providers
    if OPENVINO in real():
        return
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [OPENVINO, *real()])


class _Models(torch.nn.Module):
    """What needs a provider-specific form: attention (ONNX's fused ``Attention`` at opset 23),
    tanh GELU (ORT's contrib ``FastGelu``), hardswish (a local function), max pooling (eager's
    NaN rule: an ``If`` or a check output), batch norm, a grouped convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.conv = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Hardswish(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, groups=2, padding=1),
        )

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.gelu(self.layer(x), approximate="tanh")
        return y, self.conv(image)


def _export(providers: str) -> tuple[list[Any], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = _Models().eval()
    x, image = torch.randn(2, 5, 16), torch.randn(2, 3, 8, 8)
    with torch.no_grad(), captured_exports() as models:
        expected = model(x, image)
        got = torch.compile(model, backend="ort", options={"providers": providers})(x, image)
    return models, got, expected


def _nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    out = []
    for function in proto.functions:
        out += list(function.node)
    stack = list(proto.graph.node)
    while stack:
        node = stack.pop()
        out.append(node)
        for attr in node.attribute:
            stack += list(attr.g.node)
    return out


def test_regions_for_openvino_are_standard_typed_onnx(openvino_listed: None) -> None:
    """A region written for OpenVINO: no local function, no contrib op, no opset-23 ``Attention``,
    max pooling's NaN rule as a check output (not an ``If`` reading the outer graph), every value
    typed with its rank, opset within OpenVINO's reader; and it computes eager's values (ORT's
    CPU provider runs it here)."""
    models, got, expected = _export("openvino,cpu")
    assert_close(got, expected)
    c = metrics.counters()
    assert c["ort_runs"] > 0 and not (c["fallback_ops"] or c["ort_failures"] or c["export_failures"]), (c, metrics.fallbacks())
    assert models
    for model in models:
        proto = onnx.load_from_string(model.model_bytes)
        nodes = _nodes(proto)
        assert not proto.functions, [f.name for f in proto.functions]
        assert not [n.op_type for n in nodes if n.domain not in ("", "ai.onnx")], "contrib ops"
        assert "Attention" not in {n.op_type for n in nodes}
        for node in nodes:  # branches (the guarded softmax's) say what they give
            for attr in node.attribute:
                for out in attr.g.output:
                    assert out.type.tensor_type.elem_type and out.type.tensor_type.HasField("shape"), node.name
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        assert opset <= 22, opset
        typed = {v.name: v for v in [*proto.graph.value_info, *proto.graph.output, *proto.graph.input]}
        for node in proto.graph.node:
            for out in node.output:
                t = typed[out].type.tensor_type
                assert t.elem_type and t.HasField("shape"), (node.op_type, out)
        if any(n.op_type == "MaxPool" for n in nodes):
            assert model.checks, "max pooling's NaN rule as a check output"


def test_regions_for_the_cpu_provider_keep_orts_own_forms() -> None:
    """The same model for ORT's CPU provider keeps the forms only ORT's kernels read: its contrib
    ``FastGelu`` and ONNX's fused ``Attention`` (so the form above is a choice, not an accident)."""
    models, got, expected = _export("cpu")
    assert_close(got, expected)
    kinds = {(n.domain, n.op_type) for m in models for n in _nodes(onnx.load_from_string(m.model_bytes))}
    assert ("com.microsoft", "FastGelu") in kinds and ("", "Attention") in kinds, kinds


def test_for_providers_refuses_a_newer_opset_than_the_reader() -> None:
    from ort_lazy.export.fx import ExportError, for_providers

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [
        onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    ])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 23)])
    with pytest.raises(ExportError, match="opset 23"):
        for_providers(proto, eps.region_form((OPENVINO, CPU)))
    assert for_providers(proto, eps.region_form((CPU,))) is proto


# --------------------------------------------------------------------------- training


def test_training_graphs_leave_inference_only_providers(caplog: pytest.LogCaptureFixture) -> None:
    # a list of its own: warnings are given once per process and list
    opts = Options(providers=("CoreMLExecutionProvider", OPENVINO, CPU))
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        kept = training_options(opts, torch.device("cpu"))
        assert training_options(opts, torch.device("cpu")).providers == (CPU,)
    assert kept.providers == (CPU,)
    said = [r for r in caplog.records if "inference graphs only" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    same = Options(providers=("CUDAExecutionProvider", CPU))
    assert training_options(same, torch.device("cpu")) is same


def test_training_with_openvino_listed_runs_on_the_cpu_provider(openvino_listed: None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    twin = __import__("copy").deepcopy(model)
    x = torch.randn(4, 8)
    model(x).square().sum().backward()
    torch.compile(twin, backend="ort", options={"providers": "openvino,cpu"})(x).square().sum().backward()
    for a, b in zip(twin.parameters(), model.parameters()):
        assert_close(a.grad, b.grad)
    assert metrics.counters()["ort_runs"] >= 2
    assert set(metrics.ep_nodes()) == {CPU}, metrics.ep_nodes()


# --------------------------------------------------------------------------- which provider ran


def test_nodes_per_provider_reach_metrics_and_explain() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 8)
    torch.compile(model, backend="ort")(x)
    placed = metrics.ep_nodes()
    assert set(placed) == {CPU} and placed[CPU] >= 2, placed
    assert "ONNX nodes per execution provider" in metrics.report()
    report = explain(model, x)
    assert report.ep_nodes.get(CPU, 0) >= 2 and report.as_dict()["ep_nodes"] == report.ep_nodes


def test_provider_errors_keep_the_providers_own_words() -> None:
    from ort_lazy.runtime.session_create import _provider_error

    long = "[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: " + "x" * 400
    text = _provider_error(RuntimeError(long + "\nFrontEnd API failed:\nUnsupported input type dynamic\n\n"))
    assert "Unsupported input type dynamic" in text and len(text) < 700
    assert _provider_error(RuntimeError("one line")) == "one line"


# --------------------------------------------------------------------------- plugin EPs and policies


def test_plugin_library_that_is_not_there_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(OptionsError, match="pip install no-such-ep-package"):
        resolve_options({"ep_libraries": "no_such_ep_package"})
    with pytest.raises(OptionsError, match="no plugin EP library at"):
        resolve_options({"ep_libraries": {"MyExecutionProvider": str(tmp_path / "libmissing.so")}})
    bare = types.ModuleType("ort_lazy_test_bare_package")
    sys.modules[bare.__name__] = bare
    try:
        with pytest.raises(OptionsError, match="no get_library_path"):
            resolve_options({"ep_libraries": {"MyExecutionProvider": bare.__name__}})
    finally:
        del sys.modules[bare.__name__]


def test_a_library_orts_refuses_is_a_clear_error(tmp_path: Any) -> None:
    fake = tmp_path / "libnot_an_ep.so"
    fake.write_bytes(b"\x7fELF not really")
    with pytest.raises(OptionsError, match="onnxruntime refused"):
        resolve_options({"ep_libraries": {"NotAnExecutionProvider": str(fake)}})


def _openvino_plugin() -> Any:
    return pytest.importorskip("onnxruntime_ep_openvino", reason="the plugin package onnxruntime-ep-openvino is not installed")


def _plugin_devices(kind: str | None = None) -> list[Any]:
    import onnxruntime

    plugin = _openvino_plugin()
    eps.register_libraries({plugin.get_ep_name(): plugin.get_library_path()})
    return [
        d for d in onnxruntime.get_ep_devices()
        if d.ep_name == plugin.get_ep_name() and (kind is None or eps._device_type(d) == kind)
    ]


def test_plugin_device_that_is_not_there_is_a_clear_error() -> None:
    """A device type the plugin lists nothing for: an OptionsError naming what ORT lists, never
    a silent run elsewhere."""
    if _plugin_devices("npu"):
        pytest.skip("this machine has an NPU OpenVINO lists")
    with pytest.raises(OptionsError) as e:
        resolve_options({"ep_libraries": "onnxruntime_ep_openvino", "ep_device": "npu"})
    assert "no NPU device for OpenVINOExecutionProvider" in str(e.value) and "lists:" in str(e.value), str(e.value)


def test_plugin_ep_runs_a_model_on_its_device() -> None:
    """The OpenVINO plugin beside the standard onnxruntime, its CPU device chosen by type:
    eager's values, and ORT's record shows OpenVINO ran the nodes."""
    if not _plugin_devices("cpu"):
        import onnxruntime

        listed = [f"{d.ep_name} on {eps._device_type(d)}" for d in onnxruntime.get_ep_devices()]
        pytest.skip(f"the OpenVINO plugin lists no CPU device on this machine (its device filter is Intel's); ORT lists {listed}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="ort", options={"ep_libraries": "onnxruntime_ep_openvino", "ep_device": "cpu"})(x)
        assert_close(got, model(x))
    assert metrics.counters()["ort_runs"] > 0
    assert metrics.ep_nodes().get(OPENVINO, 0) > 0, metrics.ep_nodes()


def test_selection_policy_chooses_the_device() -> None:
    """``ep_policy`` lets ORT choose among the devices it lists (here the CPU)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(3, 8)
    got = torch.compile(model, backend="ort", options={"ep_policy": "prefer_cpu"})(x)
    assert_close(got, model(x))
    assert metrics.counters()["ort_runs"] > 0 and metrics.ep_nodes().get(CPU, 0) > 0


# --------------------------------------------------------------------------- kernel lists


def test_kernel_list_of_an_unknown_flavour_is_not_read_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-openvino's provider kills the kernel listing: its list is never read, in this
    process or another; ORT's sessions answer instead."""
    import subprocess

    from ort_lazy.runtime import _ort, flavour

    monkeypatch.setattr(_ort, "provider_libraries", lambda: ["/x/libonnxruntime_providers_openvino.so"])
    monkeypatch.setattr(flavour, "flavour", lambda: "onnxruntime-openvino")

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a child process was started")

    monkeypatch.setattr(subprocess, "run", no_child)
    with pytest.raises(_ort.KernelDefsUnavailableError, match="onnxruntime-openvino"):
        _ort.kernel_defs()


@pytest.fixture
def coreml_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """CoreML (a provider that compiles for fixed shapes) listed as installed; ORT, which does
    not have it, runs the regions on its CPU provider."""
    import onnxruntime

    real = onnxruntime.get_available_providers
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CoreMLExecutionProvider", *real()])


def test_fixed_shape_providers_get_one_model_per_shape(coreml_listed: None) -> None:
    """A provider that compiles for fixed shapes gets models without symbolic dims, one per input
    shape, without the user asking (``dynamic`` turned off: a region dynamo made symbolic runs
    the model of each shape it is called with); every call gives eager's values."""
    opts = resolve_options({"providers": "coreml,cpu"})
    assert opts.dynamic is False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model, backend="ort", options={"providers": "coreml,cpu"})
    with captured_exports() as models:
        for batch in (2, 3, 5, 3):
            x = torch.randn(batch, 8)
            assert_close(compiled(x), model(x))
    assert metrics.counters()["ort_runs"] >= 4
    shapes = set()
    for m in models:  # a region made from dynamo's symbolic graph runs a model per shape
        proto = onnx.load_from_string(m.model_bytes)
        dims = [d for i in proto.graph.input for d in i.type.tensor_type.shape.dim]
        if all(d.HasField("dim_value") for d in dims):
            shapes |= {tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in proto.graph.input}
    assert {(2, 8), (3, 8), (5, 8)} <= shapes, shapes


def test_a_region_a_provider_refuses_says_why_in_explain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session a provider refuses: the region runs in PyTorch (eager's values), and ``explain``
    gives the provider's own words for it."""
    from ort_lazy.runtime import session as session_mod
    from ort_lazy.runtime.session_create import OrtRunError

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OrtRunError(
            "ORT session creation failed for r: [ONNXRuntimeError] : 1 : FAIL : ... | "
            "While validating ONNX node '<Node(Conv)>': The input data tensor's rank has to be known (static)"
        )

    monkeypatch.setattr(session_mod, "create_session", refuse)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    x = torch.randn(2, 4)
    report = explain(model, x)
    text = str(report)
    assert "PyTorch (failed on ORT)" in text and "rank has to be known (static)" in text, text
    steps = [s for g in report.as_dict()["graphs"] for s in g["steps"] if s.get("error")]
    assert steps and "rank has to be known" in steps[0]["error"]
    assert_close(torch.compile(model, backend="ort")(x), model(x))

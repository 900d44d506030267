"""Run types, dumps, the metrics file, explain and the ort-lazy command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import ort_lazy
from helpers import assert_close, assert_ran_on_ort, captured_exports, compile_ort
from ort_lazy import _compat, cli, metrics
from ort_lazy.debug.compare import MismatchError
from ort_lazy.models import SmallCNN
from ort_lazy.reasons import Reason, suggestion
from ort_lazy.runtime import session as session_mod


def f(x):
    return torch.tanh(x) * 3 + x


def test_pytorch_run_type_isolates_the_backend():
    x = torch.randn(5)
    out = compile_ort(f, run_type="pytorch")(x)
    assert_close(out, f(x))
    c = metrics.counters()
    assert c["ort_runs"] == 0 and c["torch_runs"] == 1 and c["regions_compiled"] == 1


def test_debug_run_type_passes_when_equal_and_times_both():
    x = torch.randn(5)
    assert_close(compile_ort(f, run_type="debug")(x), f(x))
    assert_ran_on_ort()
    names = metrics.timings()
    assert any(k.startswith("debug_torch:") for k in names)
    assert any(k.startswith("run:") for k in names)


def test_debug_run_type_catches_an_injected_wrong_result(monkeypatch):
    real = session_mod.OrtRunner._run

    def wrong(self, binding, inputs):
        outs = real(self, binding, inputs)
        outs[0].view(-1)[2] += 1.0  # corrupt one element
        return outs

    monkeypatch.setattr(session_mod.OrtRunner, "_run", wrong)
    x = torch.randn(5)
    with pytest.raises(MismatchError) as e:
        compile_ort(f, run_type="debug")(x)
    msg = str(e.value)
    assert "inference_fused_0" in msg and "mismatch at (2,)" in msg and "1 of 5" in msg


def _cancelling(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum()  # float32 loses the 2 between the two large values; float64 keeps it


@pytest.mark.parametrize(
    ("ort_value", "accepted"),
    [(2.0, True), (6.0, True), (11.0, True), (1000.0, False)],
    ids=["exact", "as far as PyTorch", "within float32's rounding of 2e8", "further than float32 can tell"],
)
def test_debug_accepts_what_is_as_exact_as_pytorch(monkeypatch, ort_value, accepted):
    """An ill-conditioned output (a sum whose float32 result loses a term: PyTorch gives 0,
    the exact result is 2) beyond the tolerance still matches when ORT's value is about as
    close to the twin's float64 result as PyTorch's (within 4x its error) or as the result
    moves when the inputs move by float32's rounding (1e8 by 12), and is reported otherwise;
    the float64 run includes the weights a region binds itself."""
    x = torch.tensor([1e8, 1.0, -1e8])
    assert _cancelling(x).item() == 0.0 and _cancelling(x.double()).item() == 2.0

    def ort_result(self, binding, inputs):
        return [torch.tensor(ort_value)]

    monkeypatch.setattr(session_mod.OrtRunner, "_run", ort_result)
    compiled = compile_ort(_cancelling, run_type="debug")
    if accepted:
        assert compiled(x).item() == ort_value
        assert metrics.counters()["debug_ill_conditioned"] == 1
    else:
        with pytest.raises(MismatchError, match="1 of 1"):
            compiled(x)


def test_debug_arbiter_runs_the_region_with_its_weights_in_float64(monkeypatch):
    """A region binding a linear layer's weights: its float64 twin widens them too."""
    from ort_lazy.debug import compare

    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 1).eval()
    x = torch.randn(4, 8)
    exact = layer.double()(x.double()).detach()
    layer.float()

    def near_exact(self, binding, inputs):
        return [exact.float() + 1e-2 * exact.abs().max().float()]  # beyond the tolerance

    seen = []
    original = compare._as_exact_as_pytorch

    def spy(exact_run, expected, actual, rtol, atol):
        result = exact_run()
        seen.append(result[0].dtype if isinstance(result, (list, tuple)) else result.dtype)
        return original(exact_run, expected, actual, rtol, atol)

    monkeypatch.setattr(session_mod.OrtRunner, "_run", near_exact)
    monkeypatch.setattr(compare, "_as_exact_as_pytorch", spy)
    with torch.no_grad(), pytest.raises(MismatchError):
        compile_ort(layer, run_type="debug")(x)  # 1e-2 off: further than PyTorch's float32
    assert seen == [torch.float64], seen


@pytest.mark.parametrize(
    ("x1", "ort_value", "accepted"),
    [
        (1.0 - 2.0**-16, 2.0**16 / (1 + 1 / 256), True),
        (1.0 - 2.0**-16, 2.0**16 * 1.5, False),
        (0.5, 2.0 * (1 + 5e-3), False),
    ],
    ids=["ill-conditioned, within its sensitivity", "ill-conditioned, beyond it", "well-conditioned"],
)
def test_debug_arbiter_weighs_errors_by_the_output_s_sensitivity(x1, ort_value, accepted):
    """``1 / (x0 - x1)`` of two close float32 numbers: PyTorch's subtraction is exact (so its
    error, 0, excuses nothing), but an ORT value as if ``x0`` were rounded one step the other
    way (1/256 off, beyond the tolerance) is as good as float32 can tell: the exact result moves
    further (2%) when the inputs move by their rounding. Further off, or on a well-conditioned
    difference, it is a mismatch."""
    from ort_lazy.debug.compare import JITTER_RUNS, _sensitivity, compare_region, widened
    from ort_lazy.options import Options

    x = torch.tensor([1.0, x1])

    def twin(args):
        return [1 / (args[0][0] - args[0][1])]

    assert twin([x])[0].item() == twin([x.double()])[0].item()  # PyTorch's float32 result is exact
    exact = twin([widened(x)])
    moved = _sensitivity(lambda jitter=None: twin([widened(x, jitter)]), exact)
    assert JITTER_RUNS >= 1 and moved is not None
    assert (moved[0] > 1e-2 * exact[0].item()) == (x1 != 0.5), moved  # ill-conditioned or not
    metrics.reset()
    if accepted:
        compare_region("r", twin, [x], [torch.tensor(ort_value)], Options())
        assert metrics.counters()["debug_ill_conditioned"] == 1
    else:
        with pytest.raises(MismatchError, match="1 of 1"):
            compare_region("r", twin, [x], [torch.tensor(ort_value)], Options())


def test_debug_arbiter_leaves_integer_outputs_to_the_tolerance():
    """An ill-conditioned float output does not excuse a wrong integer one beside it."""
    from ort_lazy.debug.compare import compare_region
    from ort_lazy.options import Options

    x = torch.tensor([1e8, 1.0, -1e8])

    def twin(args):
        return [(args[0] * 2).sum(), torch.tensor([3])]

    options = Options()
    compare_region("r", twin, [x], [torch.tensor(2.0), torch.tensor([3])], options)  # the float arbitrated
    with pytest.raises(MismatchError):  # the first difference, the float one, is reported
        compare_region("r", twin, [x], [torch.tensor(2.0), torch.tensor([4])], options)


def test_debug_catches_dtype_and_shape_mismatch():
    from ort_lazy.debug.compare import compare_outputs

    with pytest.raises(MismatchError, match="dtype"):
        compare_outputs("r", [torch.zeros(2)], [torch.zeros(2, dtype=torch.float64)], 1e-3, 1e-5)
    with pytest.raises(MismatchError, match="shape"):
        compare_outputs("r", [torch.zeros(2)], [torch.zeros(3)], 1e-3, 1e-5)


def test_debug_run_type_through_fx_front_door():
    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4)
    out = ort_lazy.fx.compile(gm, [x], run_type="debug")(x)
    assert_close(out, f(x))
    assert any(k.startswith("debug_torch:") for k in metrics.timings())


def test_dump_dir_writes_loadable_models(tmp_path):
    x = torch.randn(3, 4)
    compile_ort(f, dump_dir=str(tmp_path))(x)
    onnx_files = sorted(tmp_path.glob("*.onnx"))
    assert len(onnx_files) == 1
    prefix = onnx_files[0].with_suffix("")
    schema = json.loads(prefix.with_suffix(".schema.json").read_text())
    graph_text = prefix.with_suffix(".graph.txt").read_text()
    assert "tanh" in graph_text
    assert schema["inputs"][0]["dtype"] == "float32" and schema["inputs"][0]["shape"] == [3, 4]
    model = onnx.load(str(onnx_files[0]))
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(str(onnx_files[0]), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(out, f(x).numpy(), rtol=1e-5, atol=1e-6)


def test_metrics_file_gets_a_json_line_per_compile(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("ORT_LAZY_METRICS_FILE", str(path))
    compile_ort(f)(torch.randn(3))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 1
    assert lines[0]["graph"] == "inference" and lines[0]["ops_on_ort"] == lines[0]["ops"] > 0


def test_report_has_counters_fallbacks_and_timings():
    compile_ort(f, torch_executed_ops=["aten.tanh"])(torch.randn(3))
    text = metrics.report()
    assert "aten.tanh.default" in text and "excluded by the user" in text
    assert "export" in text and "session_create" in text


def test_explain_lists_known_fallback_with_reason():
    x = torch.tensor([True, False])
    report = ort_lazy.explain(lambda t: t + t, x)
    assert report.fallbacks["aten.add.Tensor"] == {"no ORT kernel for these dtypes on this provider: Add(tensor(bool))": 1}
    text = str(report)
    assert "fix:" in text and "0/1 compute ops of the captured graphs on ORT" in text


def test_explain_training_graph_is_fully_on_ort_but_mutations():
    report = ort_lazy.explain(SmallCNN(), torch.randn(2, 3, 32, 32), backward=True, torch_preferred_ops=())
    tags = [g.tag for g in report.graphs]
    assert tags == ["forward", "backward"]
    reasons = {r for rs in report.fallbacks.values() for r in rs}
    # BatchNorm's running-stat updates are the only thing left behind
    assert reasons == {"mutates its input in place (kept in PyTorch)"}
    assert report.share_on_ort > 0.9
    d = report.as_dict()
    assert d["ops_total"] == report.ops_total and d["fallbacks"]
    # the header counts what dynamo captured and says how many graphs it compiled to
    assert "1 dynamo graph(s) compiled as the 2 graphs below" in str(report).splitlines()[0]


def test_explain_names_the_gradients_pytorch_runs_by_default():
    """With the default ``torch_preferred_ops`` explain lists the convolution and batch-norm
    gradients with their reason and how to move them to ORT."""
    report = ort_lazy.explain(SmallCNN(), torch.randn(2, 3, 32, 32), backward=True)
    preferred = Reason.PREFERRED
    assert report.fallbacks["aten.convolution_backward.default"] == {preferred: 2}
    assert report.fallbacks["aten.native_batch_norm_backward.default"] == {preferred: 2}
    text = str(report)
    assert "torch_preferred_ops" in text and suggestion(preferred) in text


def test_cli_info_json():
    out = subprocess.run([sys.executable, "-m", "ort_lazy.cli", "info", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["torch"] == torch.__version__ and "CPUExecutionProvider" in data["providers"]
    assert data["onnxruntime_flavour"] in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-training")
    assert "built" in data["bridge"]
    kernels = data["kernel_list"]
    assert kernels["read"] in ("in process", "child process") or kernels["read"].startswith("unavailable")
    if kernels["read"] == "in process":  # the CPU package: every CPU kernel, no provider library
        assert kernels["provider_libraries"] == [] and kernels["kernels"]["CPUExecutionProvider"] > 1000


def test_cli_info_warns_on_a_torch_outside_the_supported_range(monkeypatch, capsys):
    """``ort-lazy info`` says whether the running torch is supported; outside
    ``_compat.SUPPORTED_TORCH`` it warns on stderr, and the JSON on stdout stays valid."""
    assert cli.main(["info", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["torch_supported"] is True and "torch_warning" not in data
    assert "warning" not in captured.err

    major, minor = _compat.SUPPORTED_TORCH[-1]
    newer = f"{major}.{minor + 1}.0+cpu"
    monkeypatch.setattr(torch, "__version__", newer)
    assert cli.main(["info", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["torch"] == newer and data["torch_supported"] is False
    assert data["torch_warning"] == _compat.unsupported_torch_message(newer)
    assert f"warning: torch {newer} is newer than the versions ort-lazy was checked against" in captured.err

    major, minor = _compat.SUPPORTED_TORCH[0]
    monkeypatch.setattr(torch, "__version__", f"{major}.{minor - 1}.0")
    assert cli.main(["info"]) == 0
    captured = capsys.readouterr()
    assert f"warning: torch {major}.{minor - 1}.0 is older than ort-lazy supports" in captured.err
    assert f"{'torch_supported':<22}False" in captured.out


def test_cli_demo_runs_and_checks_parity(tmp_path):
    out_json = tmp_path / "demo.json"
    rc = cli.main(["demo", "--models", "seed,mlp", "--doors", "dynamo,fx", "--reps", "3", "--json", str(out_json)])
    assert rc == 0
    rows = json.loads(out_json.read_text())
    assert {(r["model"], r["door"]) for r in rows} == {("seed", "dynamo"), ("seed", "fx"), ("mlp", "dynamo"), ("mlp", "fx")}
    assert all(r["status"] == "ok" and r["ort_runs"] > 0 for r in rows)


def test_cli_explain_builtin_and_factory(tmp_path, capsys, monkeypatch):
    assert cli.main(["explain", "seed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ops_on_ort"] == data["ops_total"] == 5
    (tmp_path / "usermodel.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Linear(3, 2), (torch.randn(4, 3),)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["explain", "usermodel:make"]) == 0
    assert "compute ops of the captured graphs on ORT" in capsys.readouterr().out


def test_cli_bench_delegates(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0
    assert "--models" in capsys.readouterr().out  # the benchmark suite's own options


def test_autotune_keeps_the_faster_engine_and_explain_shows_both_timings():
    tiny = ort_lazy.explain(lambda t: t + 1, torch.randn(3), autotune=True)
    (region,) = tiny.graphs[0].regions
    tune = region["autotune"]
    assert tune["ort_ms"] > 0 and tune["pytorch_ms"] > 0 and tune["chosen"] in ("ort", "pytorch")
    assert "autotune: ORT" in str(tiny)
    if tune["chosen"] == "pytorch":
        assert tiny.fallbacks["aten.add.Tensor"] == {"PyTorch was faster for this region (autotune)": 1}
    # the decision holds for later calls: the engine that ran matches it
    metrics.reset()
    f = compile_ort(lambda t: t + 1, autotune=True)
    x = torch.randn(3)
    for _ in range(3):
        assert_close(f(x), x + 1)
    c = metrics.counters()
    # the counter exists once autotune kept a region in PyTorch (timing decides which engine wins)
    assert (c["torch_runs"] == 3) == (c.get("autotune_kept_in_pytorch", 0) == 1)
    assert any(k.startswith("autotune_ort:") for k in metrics.timings())


def test_dynamic_off_exports_one_concrete_model_per_shape():
    import onnx

    from ort_lazy.models import MLP

    model = MLP(width=16, depth=1, out=4).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ort", dynamic=True, options={"dynamic": False})
    with captured_exports() as captured, torch.no_grad():
        for b in (2, 3, 5, 3):
            x = torch.randn(b, 16)
            assert_close(compiled(x), model(x))
    concrete = [m for m in captured if all(s.static for s in m.input_specs)]
    assert len(concrete) == 3  # batch 3 the second time reuses its model
    for m in concrete:
        dims = [d for i in onnx.load_from_string(m.model_bytes).graph.input for d in i.type.tensor_type.shape.dim]
        assert all(d.HasField("dim_value") for d in dims)
    assert_ran_on_ort(4)

"""Saving compiled models and loading them elsewhere: ``ort_lazy.save`` / ``load`` / ``export_onnx``.

- round trips in a fresh process (the MLP through the direct path, a model with an op kept in
  PyTorch through its graph): outputs as eager's at two batch sizes, ORT ran, load and first
  call within the budget, nothing of dynamo or the exporter imported;
- the artifact's safety: a truncated, damaged, tampered or extended file, a newer layout, an
  onnxruntime too old for its opsets, an operator whose schema changed, a program read by
  another torch minor: each an :class:`ArtifactError` saying so, never a crash or a result;
- one ONNX file run by onnxruntime in a process that never imports torch, and the error that
  names the ops a model would leave in PyTorch;
- the ``ort-lazy save`` and ``ort-lazy info`` commands.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.export import Dim

import ort_lazy
from ort_lazy import cli, metrics
from ort_lazy.models import MLP
from ort_lazy.runtime import artifact_format
from ort_lazy.runtime.artifact_format import ArtifactError
from ort_lazy.specs import parse_dim
from saved_runs import check_in_fresh_process, eager_calls, env


class Mixed(torch.nn.Module):
    """Two linear layers with a cumulative sum between (kept in PyTorch by
    ``torch_executed_ops``), a softmax, and a size as a second output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)
        self.scale = torch.nn.Parameter(torch.rand(32) + 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        h = torch.cumsum(torch.relu(self.a(x)), dim=1) * self.scale
        return self.b(h).softmax(-1), h.shape[0] * 2


BATCH = Dim("batch", min=1, max=128)


@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = MLP().eval()
    path = tmp_path_factory.mktemp("mlp") / "mlp.ortl"
    ort_lazy.save(model, (torch.randn(32, 256),), path, dynamic_shapes=({0: BATCH},))
    return path, model


@pytest.fixture(scope="module")
def mixed_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = Mixed().eval()
    path = tmp_path_factory.mktemp("mixed") / "mixed.ortl"
    ort_lazy.save(model, (torch.randn(4, 16),), path, dynamic_shapes=({0: BATCH},), torch_executed_ops=["aten.cumsum"], program=True)
    return path, model


def test_mlp_round_trip_in_a_fresh_process(mlp_artifact: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    path, model = mlp_artifact
    calls = eager_calls(model, [((torch.randn(32, 256),), {}), ((torch.randn(5, 256),), {})])
    check_in_fresh_process(path, calls, tmp_path, direct=True)


def test_mixed_model_round_trip_in_a_fresh_process(mixed_artifact: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    path, model = mixed_artifact
    summary = artifact_format.summary(path)
    assert "aten.cumsum.default" in summary["ops_in_pytorch"]
    assert len(summary["regions"]) == 2
    calls = eager_calls(model, [((torch.randn(4, 16),), {}), ((torch.randn(9, 16),), {})])
    report = check_in_fresh_process(path, calls, tmp_path, direct=False)
    assert report["ort_runs"] == 2 * len(calls)  # both regions, each call


def test_mixed_model_returns_the_size_output(mixed_artifact: tuple[Path, torch.nn.Module]) -> None:
    path, model = mixed_artifact
    loaded = ort_lazy.load(path)
    x = torch.randn(7, 16)
    out, size = loaded(x)
    with torch.no_grad():
        expected, expected_size = model(x)
    assert size == expected_size == 14
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6)


def test_weights_are_stored_once(mlp_artifact: tuple[Path, torch.nn.Module]) -> None:
    path, model = mlp_artifact
    weight_bytes = sum(p.nbytes for p in model.parameters())
    with zipfile.ZipFile(path) as z:
        sizes = {i.filename: i.file_size for i in z.infolist()}
    assert sizes["weights.bin"] >= weight_bytes
    others = sum(v for k, v in sizes.items() if k != "weights.bin")
    assert others < weight_bytes / 10, sizes  # the ONNX models declare the weights, hold none
    assert "program.pt2" not in sizes


def test_loaded_call_checks_its_inputs(mlp_artifact: tuple[Path, torch.nn.Module]) -> None:
    loaded = ort_lazy.load(mlp_artifact[0])
    with pytest.raises(ValueError, match="float32"):
        loaded(torch.randn(4, 256, dtype=torch.float64))
    with pytest.raises(ValueError, match="dim 1 must be 256"):
        loaded(torch.randn(4, 255))
    with pytest.raises(ValueError, match="takes sizes 1..128"):
        loaded(torch.randn(129, 256))
    with pytest.raises(TypeError, match="structured as"):
        loaded(torch.randn(4, 256), torch.randn(4, 256))
    # a non-contiguous input is read as its values
    x = torch.randn(256, 6).t()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), mlp_artifact[1](x), rtol=1e-4, atol=1e-6)


def test_direct_path_times_its_thread_count(mlp_artifact: tuple[Path, torch.nn.Module]) -> None:
    """The MLP's work at its example (12.6 MFLOP) is in the thread trial's range: its first
    calls time one thread against PyTorch's count, as a compiled region's do, and the faster
    runner stays; every call's result is the model's."""
    if torch.get_num_threads() < 2:
        pytest.skip("one PyTorch thread: no trial")
    path, model = mlp_artifact
    loaded = ort_lazy.load(path)
    x = torch.randn(32, 256)
    with torch.no_grad():
        expected = model(x)
    for _ in range(40):
        torch.testing.assert_close(loaded(x), expected, rtol=1e-4, atol=1e-5)
    assert metrics.counters()["thread_trials"] == 1
    assert loaded.regions["r0"].runner.threads in (1, None)


def test_load_options_reach_the_sessions(mlp_artifact: tuple[Path, torch.nn.Module]) -> None:
    loaded = ort_lazy.load(mlp_artifact[0], session_options={"intra_op_num_threads": 1})
    assert loaded.regions["r0"].runner.options.session_options["intra_op_num_threads"] == 1
    with pytest.raises(ort_lazy.OptionsError, match="unknown execution provider"):
        ort_lazy.load(mlp_artifact[0], providers=["NoSuchExecutionProvider"])


def test_program_is_kept_on_request(mixed_artifact: tuple[Path, torch.nn.Module], mlp_artifact: tuple[Path, torch.nn.Module]) -> None:
    loaded = ort_lazy.load(mixed_artifact[0])
    program = loaded.program
    x = torch.randn(6, 16)
    torch.testing.assert_close(program.module()(x)[0], loaded(x)[0])
    # the op's fake implementation keeps the dynamic dim: the program exports again
    again = torch.export.export(program.module(), (x,), dynamic_shapes=({0: Dim("b", min=2, max=64)},))
    torch.testing.assert_close(again.module()(torch.randn(11, 16))[0].shape, torch.Size([11, 8]))
    with pytest.raises(ArtifactError, match="program=True"):
        _ = ort_lazy.load(mlp_artifact[0]).program


# -- the artifact's safety ------------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, change: dict[str, bytes | None], manifest: Any = None, rehash: bool = False) -> None:
    """Copy the artifact ``src`` to ``dst`` with members replaced (None: removed) and the
    manifest changed by ``manifest(dict)``; ``rehash``: the manifest's hashes follow the
    changed members (a tamperer's consistent edit)."""
    with zipfile.ZipFile(src) as z:
        members = {name: z.read(name) for name in z.namelist()}
    for name, data in change.items():
        if data is None:
            members.pop(name, None)
        else:
            members[name] = data
    m = json.loads(members["manifest.json"])
    if rehash:
        for name, data in members.items():
            if name in m["members"]:
                m["members"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if manifest is not None:
        manifest(m)
    members["manifest.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _member(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(name)


def test_truncated_artifact(mlp_artifact: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    data = mlp_artifact[0].read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 100):
        bad = tmp_path / f"cut{cut}.ortl"
        bad.write_bytes(data[:cut])
        with pytest.raises(ArtifactError, match="truncated|damaged|not an ort-lazy artifact"):
            ort_lazy.load(bad)


def test_damaged_member(mlp_artifact: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    data = bytearray(mlp_artifact[0].read_bytes())
    with zipfile.ZipFile(mlp_artifact[0]) as z:
        info = z.getinfo("weights.bin")
    data[info.header_offset + 30 + len(info.filename) + 1000] ^= 0xFF  # a byte inside the weights
    bad = tmp_path / "flipped.ortl"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="damaged|sha256"):
        ort_lazy.load(bad)


def test_tampered_members(mlp_artifact: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    src = mlp_artifact[0]
    weights = bytearray(_member(src, "weights.bin"))
    weights[4:8] = np.float32(1e6).tobytes()
    cases = {
        "weights": ({"weights.bin": bytes(weights)}, "weights.bin does not match its sha256"),
        "model": ({"regions/r0.onnx": _member(src, "regions/r0.onnx") + b"\0"}, "regions/r0.onnx has .* bytes"),
        "extra": ({"payload.py": b"print('hi')"}, "does not list"),
        "missing": ({"graph.json": None}, "missing"),
    }
    for name, (change, message) in cases.items():
        bad = tmp_path / f"{name}.ortl"
        _rewrite(src, bad, change)
        with pytest.raises(ArtifactError, match=message):
            ort_lazy.load(bad)


def test_consistently_rehashed_tampering_is_still_refused_where_it_is_malformed(
    mlp_artifact: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    src = mlp_artifact[0]
    bad = tmp_path / "short_weights.ortl"
    _rewrite(src, bad, {"weights.bin": _member(src, "weights.bin")[:1000]}, rehash=True)
    with pytest.raises(ArtifactError, match="do not fit"):
        ort_lazy.load(bad)
    evil = tmp_path / "evil_dim.ortl"

    def dim(m: dict[str, Any]) -> None:
        m["regions"][0]["model"]["outputs"][0]["shape"][0] = "__import__('os').getpid()"

    _rewrite(src, evil, {}, manifest=dim)
    with pytest.raises(ArtifactError, match="dim"):
        ort_lazy.load(evil)


def test_not_an_artifact(tmp_path: Path) -> None:
    text = tmp_path / "text.ortl"
    text.write_text("hello")
    with pytest.raises(ArtifactError, match="not an ort-lazy artifact"):
        ort_lazy.load(text)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("manifest.json", json.dumps({"format": "something-else"}))
    with pytest.raises(ArtifactError, match="not an ort-lazy artifact"):
        ort_lazy.load(other)
    with pytest.raises(ArtifactError, match="no such artifact"):
        ort_lazy.load(tmp_path / "missing.ortl")


def test_versions_it_cannot_honour(mlp_artifact: tuple[Path, torch.nn.Module], mixed_artifact: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    src = mlp_artifact[0]

    def newer_layout(m: dict[str, Any]) -> None:
        m["format_version"] = artifact_format.FORMAT_VERSION + 1

    def newer_opset(m: dict[str, Any]) -> None:
        m["regions"][0]["opsets"][""] = max(artifact_format.ORT_FOR_OPSET) + 1
        m["versions"]["onnxruntime"] = "99.0.0"

    def newer_ir(m: dict[str, Any]) -> None:
        m["regions"][0]["ir_version"] = 99

    for name, edit, message in (
        ("layout", newer_layout, "upgrade ort-lazy"),
        ("opset", newer_opset, "needs onnxruntime >= 99.0"),
        ("ir", newer_ir, "IR version 99"),
    ):
        bad = tmp_path / f"{name}.ortl"
        _rewrite(src, bad, {}, manifest=edit)
        with pytest.raises(ArtifactError, match=message):
            ort_lazy.load(bad)

    # another torch: the graph's operators are checked one by one; the program refused
    def older_torch(m: dict[str, Any]) -> None:
        m["versions"]["torch"] = "2.11.0"

    older = tmp_path / "older_torch.ortl"
    _rewrite(mixed_artifact[0], older, {}, manifest=older_torch)
    loaded = ort_lazy.load(older)
    assert loaded(torch.randn(3, 16))[1] == 6
    with pytest.raises(ArtifactError, match="same torch minor version"):
        _ = loaded.program

    graph = json.loads(_member(mixed_artifact[0], "graph.json"))
    for node in graph["nodes"]:
        if node.get("op") == "aten.cumsum.default":
            node["schema"] = node["schema"].replace("int dim", "int axis")
    changed = tmp_path / "changed_schema.ortl"
    _rewrite(mixed_artifact[0], changed, {"graph.json": json.dumps(graph).encode()}, manifest=older_torch, rehash=True)
    with pytest.raises(ArtifactError, match=r"aten.cumsum.default changed between torch 2.11.0"):
        ort_lazy.load(changed)

    for node in graph["nodes"]:
        if node.get("op") == "aten.cumsum.default":
            node["op"] = "mylib.cumulative.default"
    foreign = tmp_path / "foreign_op.ortl"
    _rewrite(mixed_artifact[0], foreign, {"graph.json": json.dumps(graph).encode()}, rehash=True)
    with pytest.raises(ArtifactError, match="mylib.cumulative.default, which this torch .*import the library"):
        ort_lazy.load(foreign)


def test_dim_expressions_are_arithmetic_only() -> None:
    assert parse_dim("2*s0 + (s1//3) - 1")({"s0": 5, "s1": 10}) == 12
    assert parse_dim("Max(1, s0)")({"s0": 0}) == 1
    for bad in ("__import__('os')", "s0.real", "s0 ** 2", "lambda: 1", "[s0]"):
        with pytest.raises(ValueError):
            parse_dim(bad)


# -- one ONNX file ------------------------------------------------------------------------------------

ONNX_CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
data = np.load(sys.argv[2])
errors = []
for i in range(2):
    out = sess.run(None, {"x": data[f"x{i}"]})[0]
    expected = data[f"y{i}"]
    errors.append(float(np.abs(out - expected).max() / max(1e-6, np.abs(expected).max())))
print("RESULT " + json.dumps({"errors": errors, "torch": "torch" in sys.modules,
      "inputs": [(i.name, i.shape) for i in sess.get_inputs()], "outputs": [o.name for o in sess.get_outputs()]}))
"""


def test_export_onnx_runs_without_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP(width=64).eval()
    path = tmp_path / "mlp.onnx"
    result = ort_lazy.export_onnx(model, (torch.randn(8, 64),), path, dynamic_shapes=({0: Dim("batch")},))
    assert result["inputs"] == ["x"] and result["outputs"] == ["output_0"], result
    xs = [torch.randn(8, 64), torch.randn(3, 64)]
    with torch.no_grad():
        ys = [model(x) for x in xs]
    np.savez(tmp_path / "data.npz", **{f"x{i}": x.numpy() for i, x in enumerate(xs)}, **{f"y{i}": y.numpy() for i, y in enumerate(ys)})
    proc = subprocess.run(
        [sys.executable, "-c", ONNX_CHILD, str(path), str(tmp_path / "data.npz")], capture_output=True, text=True, timeout=300, env=env()
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    report = json.loads(line[len("RESULT ") :])
    assert not report["torch"]
    assert report["inputs"] == [["x", ["batch", 64]]]
    assert max(report["errors"]) < 1e-4, report


def test_an_input_named_as_a_builtin_keeps_its_name(tmp_path: Path) -> None:
    """``nn.Sequential``'s argument is ``input``, a builtin's name, which a copy of an FX graph
    renames (``input_1``): the saved program, the loaded model and the ONNX file keep ``input``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(4, 8)
    result = ort_lazy.save(model, (x,), tmp_path / "seq.ortl", dynamic_shapes=({0: Dim("batch")},), program=True)
    assert result["inputs"] == ["input"], result
    loaded = ort_lazy.load(tmp_path / "seq.ortl")
    for n in (4, 9):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x))
    written = ort_lazy.export_onnx(model, (x,), tmp_path / "seq.onnx", dynamic_shapes={"input": {0: Dim("batch")}})
    assert written["inputs"] == ["input"] and written["dims"] == {next(iter(written["dims"])): "batch"}, written


def test_export_onnx_names_the_ops_left_in_pytorch(tmp_path: Path) -> None:
    with pytest.raises(ort_lazy.SaveError, match="aten.cumsum.default"):
        ort_lazy.export_onnx(Mixed().eval(), (torch.randn(4, 16),), tmp_path / "mixed.onnx", torch_executed_ops=["aten.cumsum"])
    assert not (tmp_path / "mixed.onnx").exists()


# -- save's own checks ----------------------------------------------------------------------------------


def test_save_restores_the_training_mode_and_verifies(tmp_path: Path) -> None:
    model = MLP(width=32)
    model.train()
    info = ort_lazy.save(model, torch.randn(4, 32), tmp_path / "m.ortl")
    assert model.training
    assert info["runs"].startswith("direct") and info["weights"]["count"] == 8
    assert metrics.counters()["artifacts_saved"] == 1


def test_save_refuses_what_it_cannot_hold(tmp_path: Path) -> None:
    class Writes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return x * 2

    with pytest.raises(ort_lazy.SaveError, match="writes into its state"):
        ort_lazy.save(Writes(), torch.randn(3), tmp_path / "w.ortl")
    assert not (tmp_path / "w.ortl").exists()


# -- the commands ---------------------------------------------------------------------------------------

FACTORY = '''
import torch
from ort_lazy.models import MLP


def make():
    torch.manual_seed(0)
    return MLP(width=32), (torch.randn(4, 32),), ({0: torch.export.Dim("batch")},)
'''


def test_cli_save_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "factory_mod.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "m.ortl"
    assert cli.main(["save", "factory_mod:make", str(out), "--option", "min_block_size=1"]) == 0
    saved = json.loads(capsys.readouterr().out)
    assert saved["runs"].startswith("direct")
    assert cli.main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["regions"][0]["ops"] == ["aten.linear.default", "aten.relu.default"]
    assert info["versions"]["torch"] == torch.__version__
    assert cli.main(["info", str(out)]) == 0
    assert "region r0" in capsys.readouterr().out
    assert cli.main(["save", "factory_mod:make", str(tmp_path / "m.onnx"), "--onnx"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == ["x"]
    (tmp_path / "bad.ortl").write_text("no")
    assert cli.main(["info", str(tmp_path / "bad.ortl")]) == 1
    assert "not an ort-lazy artifact" in capsys.readouterr().err


# -- the runtime's outputs of symbolic shape ---------------------------------------------------------


def test_symbolic_outputs_are_allocated_by_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs whose dims the inputs' sizes give (``2*s0``, ``s0 - 1``) are torch tensors bound
    before the run; the results stay eager's at every size (``nonzero``, whose size depends on
    the data, beside them)."""
    from ort_lazy.runtime.session import OrtRunner

    runners: list[OrtRunner] = []
    original = OrtRunner.__init__

    def record(self: OrtRunner, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(OrtRunner, "__init__", record)

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = torch.cat([x, x]) * 2
        return y, x[1:] + 1, torch.nonzero(x > 0)

    compiled = ort_lazy.compile(f, dynamic=True, min_block_size=1)
    for n in (5, 9, 6):
        x = torch.randn(n, 3)
        for actual, expected in zip(compiled(x), f(x)):
            torch.testing.assert_close(actual, expected)
    assert metrics.counters()["ort_runs"] >= 3
    symbolic = [r for r in runners if not all(s.static for s in r.model.output_specs)]
    sized = {str(spec.shape): shape is not None for r in symbolic for _, spec, _, shape in r._output_plan}
    assert any(k.startswith("('2*s") for k in sized) and any(" - 1'" in k for k in sized), sized
    assert all(sized.values()), sized  # every dim an expression of the input's: torch-allocated

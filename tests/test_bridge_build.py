"""The bridge build script, its build record, and the errors when the bridge is unusable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ort_lazy.frontends import jit as jit_frontend
from ort_lazy.runtime import bridge as bridge_runtime

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "cpp" / "build_bridge.py"
BUILT = jit_frontend.bridge_info() is not None
needs_bridge = pytest.mark.skipif(not BUILT, reason="bridge not built (python build.py --enable_lazy_tensor)")


def _load_build_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_bridge", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_cli_flags_match_build_py():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--config", "--parallel", "--torch_dir", "--use_cuda", "--out_dir"):
        assert flag in out
    for config in ("Debug", "Release", "RelWithDebInfo"):
        assert config in out


def test_build_function_rejects_bad_arguments(tmp_path):
    bb = _load_build_module()
    with pytest.raises(ValueError, match="config must be one of"):
        bb.build(config="Fast", out_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no torch package"):
        bb.build(torch_dir=tmp_path, out_dir=tmp_path)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--torch_dir", str(tmp_path), "--out_dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "no torch package" in result.stderr


def test_resolve_torch_dir_accepts_site_packages_or_package():
    bb = _load_build_module()
    site = Path(torch.__file__).resolve().parent.parent
    assert bb.resolve_torch_dir(site) == site
    assert bb.resolve_torch_dir(site / "torch") == site


@pytest.mark.bridge
@needs_bridge
def test_build_record_matches_running_torch():
    info = jit_frontend.bridge_info()
    assert info["torch_version"] == torch.__version__
    assert info["config"] in ("Debug", "Release", "RelWithDebInfo")
    assert info["cuda"] is False or torch.version.cuda
    bridge = jit_frontend.load_bridge()
    assert bridge.torch_version == torch.__version__
    assert bridge.group_symbol() == "ort::CompilationGroup"


@pytest.mark.bridge
@needs_bridge
def test_build_with_torch_dir_into_out_dir(tmp_path):
    """--torch_dir builds in a subprocess against that torch (here: the installed one, cached)."""
    site = Path(torch.__file__).resolve().parent.parent
    config = jit_frontend.bridge_info()["config"]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", config, "--parallel", "2", "--torch_dir", str(site),
         "--out_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "_bridge_build.json").read_text())
    assert info["torch_version"] == torch.__version__
    assert info["torch_path"] == str(site / "torch")
    assert info["config"] == config
    libs = [p for p in tmp_path.iterdir() if p.name.startswith("_bridge.") and p.suffix == ".so"]
    assert len(libs) == 1 and libs[0].name == info["library"]


def test_mismatched_torch_is_a_clear_import_error(tmp_path, monkeypatch):
    (tmp_path / "_bridge_build.json").write_text(json.dumps({"torch_version": "2.99.0+cpu"}))
    (tmp_path / "_bridge.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    monkeypatch.setattr(bridge_runtime, "_bridge", None)
    monkeypatch.setattr(bridge_runtime, "_PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(bridge_runtime, "_BUILD_INFO", tmp_path / "_bridge_build.json")
    with pytest.raises(ImportError) as info:
        jit_frontend.load_bridge()
    message = str(info.value)
    assert "2.99.0+cpu" in message and torch.__version__ in message
    assert "python build.py --enable_lazy_tensor" in message


def test_lazy_init_without_bridge_says_how_to_build(tmp_path, monkeypatch):
    import ort_lazy

    monkeypatch.setattr(bridge_runtime, "_bridge", None)
    monkeypatch.setattr(bridge_runtime, "_PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(bridge_runtime, "_BUILD_INFO", tmp_path / "_bridge_build.json")
    with pytest.raises(RuntimeError, match=r"python build\.py --enable_lazy_tensor"):
        ort_lazy.lazy.init()
    with pytest.raises(RuntimeError, match="not built"):
        ort_lazy.jit.enable()


def test_import_ort_lazy_stays_cheap():
    code = (
        "import sys, ort_lazy; "
        "bad = [m for m in ('ort_lazy._bridge', 'ort_lazy.lazy', 'ort_lazy.jit', 'torch._lazy', 'onnx') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""build.py's decisions: the plan for each flag, checks before changes, and safe package switches.

The plan tests run ``build.py --dry_run`` (nothing is installed or built). The switch tests use a
throw-away virtual environment with stand-in ``onnxruntime`` / ``onnxruntime-gpu`` /
``onnxruntime-openvino`` / ``torch`` wheels made here, so switching flavour, a failed fetch and a
failed install are real pip runs that touch nothing else. What the build itself produces is checked in test_bridge_build.py.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_build() -> Any:
    spec = importlib.util.spec_from_file_location("ort_lazy_build_driver", ROOT / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load_build()


def dry_run(*flags: str, python: str = sys.executable, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [python, str(ROOT / "build.py"), "--dry_run", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def expected_remove(flavour: str) -> list[str]:
    """The ORT flavours installed here that a run choosing ``flavour`` must remove."""
    have = build.installed(sys.executable)
    return [
        n
        for n in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-training", "onnxruntime-openvino")
        if n != flavour and n in have
    ]


def titles(plan: dict[str, Any]) -> list[str]:
    return [s["title"] for s in plan["steps"]]


def step(plan: dict[str, Any], title: str) -> dict[str, Any]:
    found = [s for s in plan["steps"] if s["title"] == title]
    assert found, f"no step {title!r} in {titles(plan)}"
    return found[0]


def argv_of(s: dict[str, Any]) -> list[str]:
    return shlex.split(s["cmd"])


# --------------------------------------------------------------------------- flags and plans

FLAGS = [
    "--venv",
    "--no_venv",
    "--skip_deps",
    "--torch_spec",
    "--torch_index",
    "--enable_lazy_tensor",
    "--use_cuda",
    "--cuda_home",
    "--cuda_version",
    "--enable_training",
    "--use_openvino",
    "--config",
    "--build_wheel",
    "--install",
    "--test",
    "--tests",
    "--pytest_args",
    "--skip_tests",
    "--shards",
    "--shard",
    "--workers",
    "--full",
    "--demo",
    "--dry_run",
]


def test_help_documents_exactly_the_flags() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "build.py"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    documented = set(re.findall(r"^\s+(--\w+)", out.stdout, re.M)) - {"--help"}
    assert documented == set(FLAGS)
    for action in build.build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 10, f"{action.option_strings} has no help"


@pytest.mark.parametrize(
    "flags",
    [
        ["--enable_nvtx_profile"],  # NVTX ranges are a runtime option now (ORT_LAZY_NVTX=1)
        ["--parallel", "2"],  # the bridge is one source file
        ["--torch_dir", "/x"],  # PYTHONPATH=... pip install --no-build-isolation . does it
        ["--test", "--shards", "2", "--shard", "2"],
        ["--shards", "2", "--shard", "1"],
        ["--test", "--shards", "0"],
        ["--use_cuda", "--enable_training"],
        ["--use_openvino", "--use_cuda"],
        ["--use_openvino", "--enable_training"],
        ["--tests", "tests/test_fx.py"],  # selects tests: needs --test
        ["--pytest_args=-x"],  # passed to the tests: needs --test
        ["--test", "--pytest_args=-k 'unbalanced"],
        ["--cuda_version", "12.6"],
        ["--use_cuda", "--cuda_version", "twelve"],
        ["--cuda_home", "/usr/local/cuda"],
        ["--config", "Fast"],
        ["--full"],  # selects tests: needs --test
    ],
)
def test_removed_flags_and_bad_combinations_are_refused(flags: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--dry_run", *flags], capture_output=True, text=True
    )
    assert out.returncode == 2 and "error:" in out.stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--use_openvino", "--use_cuda"], "--use_cuda and --use_openvino"),
        (["--enable_training", "--use_openvino"], "--enable_training and --use_openvino"),
        (["--use_cuda", "--enable_training", "--use_openvino"], "--use_cuda and --enable_training and"),
    ],
)
def test_ort_flavour_flags_exclude_each_other(flags: list[str], named: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--dry_run", *flags], capture_output=True, text=True
    )
    assert out.returncode == 2 and named in out.stderr and "choose one" in out.stderr, out.stderr


def test_plan_lazy_tensor_test() -> None:
    plan = dry_run("--no_venv", "--enable_lazy_tensor", "--test")
    import torch

    assert plan["python"] == sys.executable and plan["torch"]["found"]["version"] == torch.__version__
    assert plan["onnxruntime"] == {"flavour": "onnxruntime", "requirement": "onnxruntime"}
    assert plan["torch"]["install"] == build.TORCH_PIN and plan["torch"]["index"] is None
    remove = expected_remove("onnxruntime")
    assert (plan["switch"] or {}).get("remove", []) == remove
    assert titles(plan) == [
        *(["switch packages (fetched first, restored on failure)"] if remove else []),
        "install torch",
        "install dependencies",
        "install test models (without torchvision)",
        "install ort-lazy (editable)",
        "run the tests",
    ]
    assert not any("uninstall" in s["cmd"] for s in plan["steps"]), "uninstalls happen in the switch only"
    assert argv_of(step(plan, "install test models (without torchvision)"))[-2:] == [
        "--no-deps",
        *build.TEST_DEPS_NO_DEPS,
    ]
    deps = argv_of(step(plan, "install dependencies"))
    assert set(["onnxruntime", *build.BASE_DEPS, *build.TEST_DEPS]) <= set(deps)
    editable = step(plan, "install ort-lazy (editable)")
    assert argv_of(editable)[-4:] == ["--no-build-isolation", "--no-deps", "-e", str(ROOT)]
    assert editable["env"] == {build.BRIDGE_ENV: "1", build.CONFIG_ENV: "Release"}
    tests = argv_of(step(plan, "run the tests"))
    assert tests[1:6] == ["-m", "pytest", "-q", "-n", "2"] and "--shards" not in tests


def test_plan_without_bridge_is_pure_and_clears_an_old_one() -> None:
    plan = dry_run("--no_venv", "--skip_deps", "--install")
    assert titles(plan) == ["remove a bridge left in src/ by an earlier build", "install ort-lazy (editable)"]
    assert step(plan, "install ort-lazy (editable)")["env"][build.BRIDGE_ENV] == "0"


def test_plan_uses_the_venv_unless_told_otherwise(tmp_path: Path) -> None:
    base = Path(sys.base_prefix) / ("python.exe" if os.name == "nt" else "bin/python3")
    if not base.is_file():
        pytest.skip(f"no base interpreter at {base} to run build.py outside a virtual environment")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
    plan = dry_run("--venv", str(tmp_path / "v"), "--test", python=str(base), env=env)
    assert titles(plan)[:2] == ["create the virtual environment", "upgrade pip"]
    assert plan["python"] == str(build.venv_python(tmp_path / "v")) == argv_of(step(plan, "run the tests"))[0]
    assert plan["venv"] == str(tmp_path / "v")


def test_plan_use_cuda_picks_cuda_torch_and_onnxruntime_gpu() -> None:
    plan = dry_run(
        "--no_venv", "--use_cuda", "--cuda_version", "12.6", "--enable_lazy_tensor", "--build_wheel"
    )
    assert plan["onnxruntime"]["requirement"] == "onnxruntime-gpu"
    assert plan["torch"]["install"] == build.TORCH_PIN + "+cu126"
    assert plan["torch"]["index"] == "https://download.pytorch.org/whl/cu126"
    # the CPU torch installed here would be replaced, and the CPU onnxruntime removed: a switch,
    # whose fetches (from the CUDA index, then PyPI) come before any removal
    switch = plan["switch"]
    assert switch["remove"] == expected_remove("onnxruntime-gpu")
    import torch

    assert not torch.__version__.endswith("+cu126"), "this test expects the CPU torch of the suite"
    assert switch["install"] == [build.TORCH_PIN + "+cu126", "onnxruntime-gpu"]
    fetch_torch = shlex.split(switch["fetch"][0])
    assert fetch_torch[3] == "download" and fetch_torch[-3:] == [
        "--index-url",
        "https://download.pytorch.org/whl/cu126",
        build.TORCH_PIN + "+cu126",
    ]
    order = titles(plan)
    assert order[0] == "switch packages (fetched first, restored on failure)"
    assert order.index("check torch is a CUDA build") < order.index("build the wheel")
    assert "nvcc found, its CUDA version matches --cuda_version" in plan["checks"]
    assert "GPU visible" not in plan["checks"]  # no tests or demo: a build-only machine is fine


def test_plan_use_openvino() -> None:
    plan = dry_run("--no_venv", "--use_openvino", "--enable_lazy_tensor", "--test")
    requirement = "onnxruntime-openvino==1.24.1"
    assert build.ORT_FLAVOURS["openvino"] == build.OPENVINO_WHEELS.requirement == requirement
    assert plan["onnxruntime"] == {"flavour": "onnxruntime-openvino", "requirement": requirement}
    # the CPU torch stays: no CUDA index, no CUDA checks
    assert plan["torch"]["install"] == build.TORCH_PIN and plan["torch"]["index"] is None
    assert plan["cuda"] is None and "check torch is a CUDA build" not in titles(plan)
    remove = expected_remove("onnxruntime-openvino")
    if remove:  # the suite's own onnxruntime: replaced through the switch, fetched first
        assert plan["switch"]["remove"] == remove and plan["switch"]["install"] == [requirement]
        (fetch,) = plan["switch"]["fetch"]
        assert shlex.split(fetch)[3] == "download" and shlex.split(fetch)[-1] == requirement
        assert titles(plan)[0] == "switch packages (fetched first, restored on failure)"
    else:
        assert plan["switch"] is None
    deps = argv_of(step(plan, "install dependencies"))
    assert requirement in deps and "onnxruntime" not in deps and "onnxruntime-gpu" not in deps
    assert not any("uninstall" in s["cmd"] for s in plan["steps"]), "uninstalls happen in the switch only"
    assert "onnxruntime-openvino==1.24.1 wheels for this python and platform" in plan["checks"]
    assert "new packages fetched before a switch removes anything" in plan["checks"]
    wheels = plan["openvino"]
    assert wheels["pythons"] == ["3.11", "3.12", "3.13"]
    assert wheels["platforms"] == ["manylinux_2_28_x86_64", "win_amd64"]
    here = (sys.version_info.major, sys.version_info.minor)
    assert wheels["here"]["python"] == "{}.{}".format(*here)
    assert wheels["here"]["platform"] == build.host_platform()
    assert wheels["problem"] == build.OPENVINO_WHEELS.problem(
        here, build.host_platform(), build.glibc_version()
    )
    assert dry_run("--no_venv", "--skip_deps")["openvino"] is None


def test_plan_enable_training() -> None:
    plan = dry_run("--no_venv", "--enable_training", "--test", "--shards", "2", "--shard", "1")
    assert plan["onnxruntime"] == {
        "flavour": "onnxruntime-training",
        "requirement": "onnxruntime-training==1.19.2",
    }
    assert (plan["switch"] or {}).get("remove", []) == expected_remove("onnxruntime-training")
    deps = argv_of(step(plan, "install dependencies"))
    assert "onnxruntime-training==1.19.2" in deps and "onnxruntime" not in deps
    assert argv_of(step(plan, "run the tests"))[-4:] == ["--shards", "2", "--shard", "1"]


def test_plan_build_wheel_config_and_test_handover() -> None:
    plan = dry_run(
        "--no_venv", "--skip_deps", "--enable_lazy_tensor", "--build_wheel", "--config", "Debug", "--test"
    )
    py, abi, platform = build.wheel_tags()
    wheel = ROOT / "dist" / f"ort_lazy-{build.package_version()}-{py}-{abi}-{platform}.whl"
    assert plan["wheel"] == str(wheel)
    assert titles(plan) == [
        "clear stale wheels",
        "build the wheel",
        "check the wheel",
        "install the wheel",
        "run the tests",
    ]
    built = step(plan, "build the wheel")
    assert argv_of(built)[3:] == [
        "wheel",
        "-q",
        "--no-build-isolation",
        "--no-deps",
        "-w",
        str(build.DIST),
        str(ROOT),
    ]
    assert built["env"] == {build.BRIDGE_ENV: "1", build.CONFIG_ENV: "Debug"}
    assert argv_of(step(plan, "install the wheel"))[-1] == str(wheel)
    assert step(plan, "run the tests")["env"][build.TEST_WHEEL_ENV] == str(wheel)

    pure = dry_run("--no_venv", "--skip_deps", "--build_wheel")
    assert pure["wheel"].endswith(f"ort_lazy-{build.package_version()}-py3-none-any.whl")
    assert step(pure, "build the wheel")["env"][build.BRIDGE_ENV] == "0"
    assert "install the wheel" not in titles(pure)


def test_plan_shards_workers_skip_tests_demo_torch_spec_and_index() -> None:
    plan = dry_run("--no_venv", "--skip_deps", "--test", "--shards", "4", "--shard", "3", "--workers", "3")
    assert argv_of(step(plan, "run the tests"))[4:] == [
        "-n",
        "3",
        str(ROOT / "tests"),
        "--shards",
        "4",
        "--shard",
        "3",
    ]
    assert plan["tests"] == {
        "shards": 4,
        "shard": 3,
        "workers": "3",
        "paths": [str(ROOT / "tests")],
        "pytest_args": [],
    }
    full = dry_run("--no_venv", "--skip_deps", "--test", "--full")
    assert argv_of(step(full, "run the tests"))[7:10] == [
        "--opinfo=full",
        "--full-tier",
        "--max-worker-restart",
    ]
    skipped = dry_run("--no_venv", "--skip_deps", "--test", "--skip_tests", "--enable_lazy_tensor")
    assert "run the tests" not in titles(skipped) and "install ort-lazy (editable)" in titles(skipped)
    demo = dry_run("--no_venv", "--skip_deps", "--demo")
    assert argv_of(step(demo, "run the demo"))[1:] == ["-m", "ort_lazy.cli", "demo"]
    spec = dry_run(
        "--no_venv", "--torch_spec", "torch==2.14.*", "--torch_index", "https://example.invalid/cpu"
    )
    assert argv_of(step(spec, "install torch"))[-3:] == [
        "torch==2.14.*",
        "--index-url",
        "https://example.invalid/cpu",
    ]


def test_plan_tests_selects_paths_and_keeps_workers_shards_and_full() -> None:
    plan = dry_run(
        "--no_venv",
        "--skip_deps",
        "--test",
        "--tests",
        "tests/test_options.py::test_env",
        "tests/opinfo",
        "--workers",
        "1",
        "--full",
        "--shards",
        "3",
        "--shard",
        "2",
        "--pytest_args",
        "-k 'add or mul' --opinfo-samples 1",
    )
    paths = [str(ROOT / "tests" / "test_options.py") + "::test_env", str(ROOT / "tests" / "opinfo")]
    assert argv_of(step(plan, "run the tests"))[1:] == [
        "-m",
        "pytest",
        "-q",
        "-n",
        "1",
        *paths,
        "--opinfo=full",
        "--full-tier",
        "--max-worker-restart",
        "100",
        "--shards",
        "3",
        "--shard",
        "2",
        "-k",
        "add or mul",
        "--opinfo-samples",
        "1",
    ]
    assert plan["tests"]["paths"] == paths and plan["tests"]["pytest_args"][:2] == ["-k", "add or mul"]
    assert "--tests paths exist" in plan["checks"]
    whole = dry_run("--no_venv", "--skip_deps", "--test")
    assert argv_of(step(whole, "run the tests"))[6:] == [str(ROOT / "tests")], "--test alone: every test"
    assert "--tests paths exist" not in whole["checks"]


def test_missing_test_path_stops_before_any_change() -> None:
    args = build.parse_args(
        ["--no_venv", "--skip_deps", "--test", "--tests", "tests/opinfo", "tests/nope.py"]
    )
    assert build.missing_tests(args) == ["tests/nope.py"]
    with pytest.raises(SystemExit, match="no such test file or folder: tests/nope.py"):
        build.preflight(args)
    skipped = build.parse_args(["--no_venv", "--test", "--skip_tests", "--tests", "tests/nope.py"])
    build.preflight(skipped)  # no tests run: nothing to look for
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--no_venv", "--test", "--tests", "tests/nope.py::test_x"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "tests/nope.py::test_x" in out.stderr and "+ " not in out.stdout


def test_preflight_refuses_unsupported_python() -> None:
    lo, hi = build.supported_pythons()
    args = build.parse_args(["--no_venv", "--skip_deps"])
    build.preflight(args, version=lo)
    build.preflight(args, version=(hi[0], hi[1] - 1))
    for bad in ((lo[0], lo[1] - 1), hi):
        with pytest.raises(SystemExit, match="supports Python"):
            build.preflight(args, version=bad)
    with pytest.raises(SystemExit, match="no wheels for"):
        build.preflight(build.parse_args(["--no_venv", "--enable_training"]), version=(3, 13))


def test_preflight_openvino_needs_a_wheel_for_this_python_and_platform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """onnxruntime-openvino 1.24.1 has wheels for CPython 3.11-3.13, manylinux_2_28_x86_64 and
    win_amd64: anything else stops before a change, saying where wheels exist."""
    args = build.parse_args(["--no_venv", "--use_openvino"])
    where = "CPython 3.11, 3.12, 3.13 on manylinux_2_28_x86_64, win_amd64"
    monkeypatch.setattr(build, "host_platform", lambda: "linux-x86_64")
    monkeypatch.setattr(build, "glibc_version", lambda: (2, 35))
    lo, hi = build.supported_pythons()
    for minor in range(lo[1], hi[1]):
        if (3, minor) in ((3, 11), (3, 12), (3, 13)):
            build.preflight(args, version=(3, minor))
        else:
            with pytest.raises(SystemExit, match=rf"no wheel for Python 3\.{minor}\b") as refused:
                build.preflight(args, version=(3, minor))
            assert where in str(refused.value) and "nothing was changed" in str(refused.value)
            assert "pip install onnxruntime-ep-openvino" in str(refused.value)  # the plugin takes any Python
    build.preflight(build.parse_args(["--no_venv", "--use_openvino", "--skip_deps"]), version=(3, 10))
    monkeypatch.setattr(build, "glibc_version", lambda: (2, 17))
    with pytest.raises(SystemExit, match=r"need glibc 2\.28 or newer, this system has glibc 2\.17"):
        build.preflight(args, version=(3, 12))
    monkeypatch.setattr(build, "glibc_version", lambda: None)  # musl
    with pytest.raises(SystemExit, match="this system has no glibc"):
        build.preflight(args, version=(3, 12))
    for plat in ("macosx-arm64", "linux-aarch64"):
        monkeypatch.setattr(build, "host_platform", lambda plat=plat: plat)
        with pytest.raises(SystemExit, match=f"no wheel for platform {plat}") as refused:
            build.preflight(args, version=(3, 12))
        assert where in str(refused.value) and "onnxruntime-ep-openvino" not in str(refused.value)
    monkeypatch.setattr(build, "host_platform", lambda: "win-amd64")
    build.preflight(args, version=(3, 13))


def test_host_platform_and_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.sysconfig, "get_platform", lambda: "macosx-11.0-arm64")
    assert build.host_platform() == "macosx-arm64"
    monkeypatch.setattr(build.sysconfig, "get_platform", lambda: "linux-x86_64")
    assert build.host_platform() == "linux-x86_64"
    monkeypatch.setattr(build.platform, "libc_ver", lambda: ("glibc", "2.28"))
    assert build.glibc_version() == (2, 28)
    monkeypatch.setattr(build.platform, "libc_ver", lambda: ("", ""))
    assert build.glibc_version() is None


def test_use_openvino_without_a_wheel_stops_before_any_change() -> None:
    """build.py's main() runs the wheel check before its first command (here: as on macOS)."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(ROOT / 'build.py')!r})\n"
        "b = importlib.util.module_from_spec(spec); sys.modules['b'] = b; spec.loader.exec_module(b)\n"
        "b.host_platform = lambda: 'macosx-arm64'\n"
        "b.main(['--no_venv', '--use_openvino', '--enable_lazy_tensor', '--test'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "no wheel for platform macosx-arm64" in out.stderr, out.stderr
    assert "+ " not in out.stdout, "a command ran before the check"


def test_use_cuda_without_toolkit_stops_before_any_change(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--no_venv", "--use_cuda", "--cuda_home", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "needs the CUDA toolkit" in out.stderr
    assert "+ " not in out.stdout, "a command ran before the check"


def fake_nvcc(root: Path, version: str = "12.6") -> Path:
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version}, V{version}.77'\n")
    nvcc.chmod(0o755)
    return root


@pytest.mark.skipif(os.name == "nt", reason="the stand-in nvcc is a POSIX shell script")
def test_use_cuda_tests_without_gpu_or_wrong_cuda_stop_before_any_change(tmp_path: Path) -> None:
    if build.gpu_visible():
        pytest.skip("a GPU is visible here")
    home = fake_nvcc(tmp_path)
    cmd = [sys.executable, str(ROOT / "build.py"), "--no_venv", "--use_cuda", "--cuda_home", str(home)]
    out = subprocess.run([*cmd, "--enable_lazy_tensor", "--test"], capture_output=True, text=True)
    assert out.returncode != 0 and "needs an NVIDIA GPU" in out.stderr and "+ " not in out.stdout
    mismatch = subprocess.run([*cmd, "--cuda_version", "11.8"], capture_output=True, text=True)
    assert mismatch.returncode != 0 and "is CUDA 12.6" in mismatch.stderr and "+ " not in mismatch.stdout


def test_check_cuda_torch_refuses_a_cpu_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build.parse_args(["--no_venv", "--use_cuda", "--cuda_version", "12.6"])
    for version, cuda, error in (("2.13.0+cpu", None, "CPU build"), ("2.13.0+cu118", "11.8", "CUDA 11.8")):
        monkeypatch.setattr(
            build, "torch_version_of", lambda py, v=version, c=cuda: {"version": v, "cuda": c, "path": "/x"}
        )
        with pytest.raises(SystemExit, match=error):
            build.check_cuda_torch(args, sys.executable)
    monkeypatch.setattr(
        build, "torch_version_of", lambda py: {"version": "2.13.0+cu126", "cuda": "12.6", "path": "/x"}
    )
    build.check_cuda_torch(args, sys.executable)


def test_check_wheel(tmp_path: Path) -> None:
    def wheel(name: str, files: dict[str, str]) -> Path:
        with zipfile.ZipFile(tmp_path / name, "w") as zf:
            for n, text in files.items():
                zf.writestr(n, text)
        return tmp_path / name

    so = "ort_lazy/_bridge.cpython-311-x86_64-linux-gnu.so"
    record = {"ort_lazy/_bridge_build.json": json.dumps({"torch_version": "2.13.0+cpu"})}
    build.check_wheel(
        wheel("ort_lazy-0.1.0-cp311-cp311-linux_x86_64.whl", {so: "", **record}), with_bridge=True
    )
    build.check_wheel(
        wheel("ort_lazy-0.1.0-py3-none-any.whl", {"ort_lazy/__init__.py": ""}), with_bridge=False
    )
    bad = {
        "holds no compiled bridge": (
            "ort_lazy-0.1.0-cp311-cp311-linux_x86_64.whl",
            {"ort_lazy/x.py": ""},
            True,
        ),
        "under a pure-Python tag": ("ort_lazy-0.1.0-py3-none-any.whl", {so: "", **record}, True),
        "not ort_lazy/_bridge_build.json": ("ort_lazy-0.1.0-cp311-cp311-linux_x86_64.whl", {so: ""}, True),
        "it was not asked to": ("ort_lazy-0.1.0-cp311-cp311-linux_x86_64.whl", {so: "", **record}, False),
    }
    for message, (name, files, with_bridge) in bad.items():
        with pytest.raises(SystemExit, match=message):
            build.check_wheel(wheel(name, files), with_bridge=with_bridge)
    with pytest.raises(SystemExit, match="was not built"):
        build.check_wheel(tmp_path / "missing.whl", with_bridge=False)


# --------------------------------------------------------------------------- safe switches


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A minimal pure wheel holding ``files`` (path -> text)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    entries = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ort-lazy-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    lines = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(text.encode())}")
    lines.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = "\n".join(lines) + "\n"
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, text in entries.items():
            zf.writestr(n, text)
    return path


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A virtual environment and a folder of stand-in wheels (the ORT flavours, a CPU torch)."""
    root = tmp_path_factory.mktemp("switch")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    wheels = root / "wheels"
    wheels.mkdir()
    for name, flavour in (("onnxruntime", "cpu"), ("onnxruntime-gpu", "gpu")):
        make_wheel(wheels, name, "1.0", {"onnxruntime/__init__.py": f"FLAVOUR = {flavour!r}\n"})
    # build.py's pin (onnxruntime-openvino==1.24.1), so its switch finds it among the stand-ins
    make_wheel(
        wheels, "onnxruntime-openvino", "1.24.1", {"onnxruntime/__init__.py": "FLAVOUR = 'openvino'\n"}
    )
    make_wheel(
        wheels,
        "torch",
        "2.13.0+cpu",
        {"torch/__init__.py": "", "torch/version.py": "__version__ = '2.13.0+cpu'\ncuda = None\n"},
    )
    return {"py": build.venv_python(root / "venv"), "wheels": wheels, "root": root}


#: pip in the sandbox sees only the stand-in wheels: no configured index, links or constraints
SANDBOX_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


def offline(sandbox: dict[str, Path]) -> list[str]:
    return ["--no-index", "--find-links", str(sandbox["wheels"])]


def reset(sandbox: dict[str, Path], *reqs: str) -> dict[str, str]:
    """Put the sandbox in a known state: exactly ``reqs`` of the stand-ins installed."""
    py = str(sandbox["py"])
    stand_ins = ["onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "torch"]
    pip = [py, "-m", "pip"]
    subprocess.run(
        [*pip, "uninstall", "-y", "-q", *stand_ins], capture_output=True, check=True, env=SANDBOX_ENV
    )
    out = subprocess.run(
        [*pip, "install", "-q", *offline(sandbox), *reqs], capture_output=True, text=True, env=SANDBOX_ENV
    )
    assert out.returncode == 0, out.stderr
    return build.installed(py)


def flavour(sandbox: dict[str, Path]) -> str:
    code = "import onnxruntime; print(onnxruntime.FLAVOUR)"
    return subprocess.run([str(sandbox["py"]), "-c", code], capture_output=True, text=True).stdout.strip()


class Recorder:
    """Runs commands for real and remembers them; ``fail_install`` fakes a failure of the real install."""

    def __init__(self, fail_install: bool = False, env: dict[str, str] | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail_install = fail_install
        self.env = env or SANDBOX_ENV

    def __call__(self, cmd: list[str]) -> int:
        self.commands.append(cmd)
        code = subprocess.run(cmd, capture_output=True, env=self.env).returncode
        real_install = cmd[3] == "install" and "--dry-run" not in cmd
        return 1 if self.fail_install and real_install else code

    def ran(self, verb: str) -> bool:
        return any(c[3] == verb for c in self.commands)


def switch(sandbox: dict[str, Path], want: str, runner: Recorder) -> Any:
    return build.Switch(
        str(sandbox["py"]),
        ["onnxruntime"],
        [([want], offline(sandbox))],
        sandbox["root"] / "work",
        runner=runner,
    )


def test_switch_fetch_failure_changes_nothing(sandbox: dict[str, Path]) -> None:
    before = reset(sandbox, "onnxruntime==1.0")
    runner = Recorder()
    with pytest.raises(SystemExit, match="nothing was changed"):
        switch(sandbox, "onnxruntime-gpu==9.9", runner).apply()  # no such wheel: the fetch fails
    assert not runner.ran("uninstall") and not runner.ran("install")
    assert build.installed(str(sandbox["py"])) == before and flavour(sandbox) == "cpu"
    assert not (sandbox["root"] / "work").exists()


def test_switch_install_failure_restores_the_environment(sandbox: dict[str, Path]) -> None:
    before = reset(sandbox, "onnxruntime==1.0")
    runner = Recorder(fail_install=True)  # onnxruntime-gpu does get installed, then "fails"
    with pytest.raises(SystemExit, match="the environment was restored"):
        switch(sandbox, "onnxruntime-gpu", runner).apply()
    assert runner.ran("uninstall") and runner.ran("install")
    assert build.installed(str(sandbox["py"])) == before
    assert flavour(sandbox) == "cpu", "the CPU flavour's files were not put back"
    assert not (sandbox["root"] / "work").exists()


@pytest.mark.full
def test_switch_succeeds(sandbox: dict[str, Path]) -> None:
    before = reset(sandbox, "onnxruntime==1.0")
    switch(sandbox, "onnxruntime-gpu", Recorder()).apply()
    after = build.installed(str(sandbox["py"]))
    assert "onnxruntime" not in after and after["onnxruntime-gpu"] == "1.0" and flavour(sandbox) == "gpu"
    assert {k: v for k, v in after.items() if k != "onnxruntime-gpu"} == {
        k: v for k, v in before.items() if k != "onnxruntime"
    }


@pytest.mark.skipif(os.name == "nt", reason="the stand-in nvcc is a POSIX shell script")
@pytest.mark.full
def test_build_py_use_cuda_unreachable_index_leaves_the_environment(
    sandbox: dict[str, Path], tmp_path: Path
) -> None:
    """build.py --use_cuda in an environment with a CPU torch and onnxruntime, no CUDA wheels to
    be had: it stops at the fetch, before uninstalling anything."""
    before = reset(sandbox, "onnxruntime==1.0", "torch==2.13.0+cpu")
    env = {**SANDBOX_ENV, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(sandbox["wheels"])}
    cmd = [str(sandbox["py"]), str(ROOT / "build.py"), "--use_cuda", "--cuda_home", str(fake_nvcc(tmp_path))]
    plan = json.loads(subprocess.run([*cmd, "--dry_run"], capture_output=True, text=True, env=env).stdout)
    assert plan["switch"]["remove"] == ["onnxruntime"]
    assert plan["switch"]["install"] == ["torch==2.13.0+cu126", "onnxruntime-gpu"]
    out = subprocess.run(
        [*cmd, "--torch_index", (tmp_path / "no-index").as_uri()], capture_output=True, text=True, env=env
    )
    assert out.returncode != 0 and "nothing was changed" in out.stderr, out.stderr
    assert "uninstall" not in out.stdout and "Skipping" not in out.stdout + out.stderr
    assert build.installed(str(sandbox["py"])) == before and flavour(sandbox) == "cpu"


def offline_env(sandbox: dict[str, Path], links: Path | None = None) -> dict[str, str]:
    """pip with no index: only the stand-in wheels (or the folder ``links``)."""
    return {**SANDBOX_ENV, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links or sandbox["wheels"])}


def openvino_switch(sandbox: dict[str, Path], runner: Recorder) -> Any:
    """The switch build.py plans for --use_openvino in the sandbox, run by ``runner``."""
    planned = build.switch_for(build.parse_args(["--use_openvino"]), str(sandbox["py"]))
    assert planned is not None
    return dataclasses.replace(planned, runner=runner)


@pytest.mark.full
def test_openvino_switch_planned_from_onnxruntime_and_restored_on_failed_install(
    sandbox: dict[str, Path],
) -> None:
    before = reset(sandbox, "onnxruntime==1.0")
    runner = Recorder(fail_install=True, env=offline_env(sandbox))  # installed, then "fails"
    switch_ = openvino_switch(sandbox, runner)
    assert switch_.remove == ["onnxruntime"] and switch_.requirements() == ["onnxruntime-openvino==1.24.1"]
    assert switch_.fetch == [(["onnxruntime-openvino==1.24.1"], [])], "from pip's own index, fetched first"
    with pytest.raises(SystemExit, match="the environment was restored"):
        switch_.apply()
    verbs = ["dry-run" if "--dry-run" in c else c[3] for c in runner.commands]
    assert verbs[:4] == ["download", "dry-run", "uninstall", "install"], verbs  # then the restore
    assert build.installed(str(sandbox["py"])) == before
    assert flavour(sandbox) == "cpu", "the CPU flavour's files were not put back"
    assert not switch_.workdir.exists()


def test_openvino_switch_succeeds_and_switches_back(sandbox: dict[str, Path]) -> None:
    before = reset(sandbox, "onnxruntime==1.0")
    openvino_switch(sandbox, Recorder(env=offline_env(sandbox))).apply()
    after = build.installed(str(sandbox["py"]))
    assert "onnxruntime" not in after and after["onnxruntime-openvino"] == "1.24.1"
    assert flavour(sandbox) == "openvino"
    assert {k: v for k, v in after.items() if k != "onnxruntime-openvino"} == {
        k: v for k, v in before.items() if k != "onnxruntime"
    }
    # and the default flavour takes it out again
    back = build.switch_for(build.parse_args([]), str(sandbox["py"]))
    assert (
        back is not None
        and back.remove == ["onnxruntime-openvino"]
        and back.requirements() == ["onnxruntime"]
    )


@pytest.mark.full
def test_build_py_use_openvino_without_the_wheel_leaves_the_environment(
    sandbox: dict[str, Path], tmp_path: Path
) -> None:
    """build.py --use_openvino in an environment with onnxruntime, onnxruntime-openvino not to be
    had: it stops at the wheel check or at the fetch, before uninstalling anything."""
    before = reset(sandbox, "onnxruntime==1.0")
    cmd = [str(sandbox["py"]), str(ROOT / "build.py"), "--use_openvino"]
    plan = json.loads(
        subprocess.run([*cmd, "--dry_run"], capture_output=True, text=True, env=offline_env(sandbox)).stdout
    )
    assert plan["switch"]["remove"] == ["onnxruntime"]
    assert plan["switch"]["install"] == ["onnxruntime-openvino==1.24.1"]
    (tmp_path / "empty").mkdir()
    out = subprocess.run(cmd, capture_output=True, text=True, env=offline_env(sandbox, tmp_path / "empty"))
    assert out.returncode != 0 and "nothing was changed" in out.stderr, out.stderr
    if plan["openvino"]["problem"]:  # no wheel for this Python/platform: the check stops it
        assert "+ " not in out.stdout and plan["openvino"]["problem"] in out.stderr
    else:  # the fetch fails
        assert "could not fetch onnxruntime-openvino==1.24.1" in out.stderr
    assert "uninstall" not in out.stdout and "Skipping" not in out.stdout + out.stderr
    assert build.installed(str(sandbox["py"])) == before and flavour(sandbox) == "cpu"


@pytest.mark.full
def test_plan_removes_only_installed_flavours(sandbox: dict[str, Path]) -> None:
    reset(sandbox, "onnxruntime-gpu==1.0")
    plan = dry_run("--skip_tests", python=str(sandbox["py"]))
    assert plan["switch"]["remove"] == ["onnxruntime-gpu"] and plan["switch"]["install"] == ["onnxruntime"]
    assert titles(plan)[0] == "switch packages (fetched first, restored on failure)"
    reset(sandbox, "onnxruntime-openvino==1.24.1")
    plan = dry_run("--skip_tests", python=str(sandbox["py"]))
    assert plan["switch"]["remove"] == ["onnxruntime-openvino"]
    assert dry_run("--use_openvino", python=str(sandbox["py"]))["switch"] is None
    reset(sandbox, "onnxruntime==1.0")
    assert dry_run(python=str(sandbox["py"]))["switch"] is None


def test_a_named_venv_is_used_from_inside_another(tmp_path: Path) -> None:
    """The suite's interpreter runs in a virtual environment: without --venv the plan runs in it;
    a named --venv is created and used instead (the OpenVINO flavour never replaces the active
    environment's onnxruntime), and from inside that one the plan runs there without re-executing."""
    assert sys.prefix != sys.base_prefix, "the suite runs in a virtual environment"
    assert dry_run("--skip_deps")["venv"] is None
    other = tmp_path / "other"
    assert dry_run("--skip_deps", "--venv", str(other))["venv"] == str(other)
    assert dry_run("--skip_deps", "--venv", sys.prefix)["venv"] is None
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--dry_run", "--no_venv", "--venv", str(other)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--venv and --no_venv exclude each other" in out.stderr

"""Packaging checks: build.py's flags and plans, the conda recipe's variants, environment.yml, CI.

The recipe is rendered offline with py-rattler-build (no channel needed); build.py is run with
``--dry_run`` (nothing is installed or built) or its functions are called directly.
"""

from __future__ import annotations

import importlib.util
import itertools
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

try:
    import tomllib
except ImportError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

yaml = pytest.importorskip("yaml", reason="pyyaml is a test dependency (build.py installs it)")

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "recipe.yaml"
VARIANTS = ROOT / "recipe" / "variants.yaml"
WORKFLOW = ROOT / "ci" / "workflows" / "build.yml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: pip name -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch"}


def _load_build() -> Any:
    spec = importlib.util.spec_from_file_location("ort_lazy_build_driver", ROOT / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load_build()


def package_version() -> str:
    text = (ROOT / "src" / "ort_lazy" / "_version.py").read_text()
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


# --------------------------------------------------------------------------- requirement strings


def pip_requirement(req: str) -> tuple[str, set[str]]:
    """``"torch>=2.13,<2.15"`` -> ``("torch", {">=2.13", "<2.15"})`` (markers not supported)."""
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", req)
    assert m and ";" not in req, req
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    return name, {c.strip() for c in m.group(2).split(",") if c.strip()}


def conda_requirement(spec: str) -> tuple[str, set[str], str | None]:
    """``"pytorch >=2.13,<2.15 cpu*"`` -> ``("pytorch", {">=2.13", "<2.15"}, "cpu*")``."""
    parts = spec.split()
    name = parts[0].lower()
    version = set() if len(parts) < 2 or parts[1] == "*" else {c for c in parts[1].split(",") if c}
    return name, version, parts[2] if len(parts) > 2 else None


def project_requirements(*extras: str) -> dict[str, set[str]]:
    reqs = list(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        reqs += PYPROJECT["project"]["optional-dependencies"][extra]
    return dict(pip_requirement(r) for r in reqs)


# --------------------------------------------------------------------------- build.py


def dry_run(*flags: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--dry_run", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def step(plan: dict[str, Any], title: str) -> dict[str, Any]:
    found = [s for s in plan["steps"] if s["title"] == title]
    assert found, f"no step {title!r} in {[s['title'] for s in plan['steps']]}"
    return found[0]


def titles(plan: dict[str, Any]) -> list[str]:
    return [s["title"] for s in plan["steps"]]


def argv_of(s: dict[str, Any]) -> list[str]:
    return shlex.split(s["cmd"])


ISSUE_FLAGS = [
    "--enable_lazy_tensor",
    "--use_cuda",
    "--cuda_home",
    "--cuda_version",
    "--torch_dir",
    "--config",
    "--parallel",
    "--build_wheel",
    "--install",
    "--test",
    "--shards",
    "--shard",
    "--skip_tests",
    "--enable_nvtx_profile",
    "--enable_training",
    "--dry_run",
    "--demo",
    "--no_venv",
    "--skip_deps",
]


def test_help_documents_every_flag() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "build.py"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ISSUE_FLAGS:
        assert re.search(rf"^\s+{flag}\b", out.stdout, re.M), f"{flag} missing from --help"
    for action in build.build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 10, f"{action.option_strings} has no help"


def test_plan_default_lazy_tensor_test() -> None:
    plan = dry_run("--no_venv", "--enable_lazy_tensor", "--test")
    assert plan["python"] == sys.executable
    assert plan["onnxruntime"] == {"flavour": "onnxruntime", "requirement": "onnxruntime"}
    assert plan["torch"]["install"] == build.TORCH_PIN and plan["torch"]["index"] is None
    found = plan["torch"]["found"]
    import torch

    assert found["version"] == torch.__version__ and found["source"] == sys.executable
    assert titles(plan) == [
        "remove the other ORT flavours (same module name)",
        "install torch",
        "install dependencies",
        "install test models (without torchvision)",
        "build the bridge",
        "record the build options in _bridge_build.json",
        "install ort-lazy (editable)",
        "run the tests",
    ]
    assert argv_of(step(plan, "install test models (without torchvision)"))[-2:] == ["--no-deps", *build.TEST_DEPS_NO_DEPS]
    assert argv_of(step(plan, "remove the other ORT flavours (same module name)"))[-2:] == [
        "onnxruntime-gpu",
        "onnxruntime-training",
    ]
    deps = argv_of(step(plan, "install dependencies"))
    for dep in ["onnxruntime", *build.BASE_DEPS, *build.TEST_DEPS]:
        assert dep in deps
    bridge = argv_of(step(plan, "build the bridge"))
    assert Path(bridge[1]) == ROOT / "cpp" / "build_bridge.py"
    assert bridge[2:] == ["--config", "Release", "--parallel", str(plan["bridge"]["parallel"])]
    assert "-O3" in plan["bridge"]["compiler_flags"]
    assert f'-DORT_LAZY_TORCH_VERSION="{torch.__version__}"' in plan["bridge"]["compiler_flags"]
    tests = argv_of(step(plan, "run the tests"))
    assert tests[1:6] == ["-m", "pytest", "-q", "-n", "2"] and "--shards" not in tests
    assert plan["cuda"] is None and plan["wheel"] is None


def test_plan_uses_the_venv_unless_told_otherwise(tmp_path: Path) -> None:
    base = Path(sys.base_prefix) / ("python.exe" if os.name == "nt" else "bin/python3")
    if not base.is_file():
        pytest.skip(f"no base interpreter at {base} to run build.py outside a virtual environment")
    out = subprocess.run(
        [str(base), str(ROOT / "build.py"), "--dry_run", "--venv", str(tmp_path / "v"), "--test"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")},
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert titles(plan)[:2] == ["create the virtual environment", "upgrade pip"]
    assert plan["python"] == str(build.venv_python(tmp_path / "v")) == argv_of(step(plan, "run the tests"))[0]
    assert plan["venv"] == str(tmp_path / "v")


def test_plan_use_cuda() -> None:
    plan = dry_run(
        "--no_venv", "--use_cuda", "--cuda_version", "12.6", "--enable_lazy_tensor", "--build_wheel"
    )
    assert plan["onnxruntime"]["requirement"] == "onnxruntime-gpu"
    assert plan["torch"]["install"] == build.TORCH_PIN + "+cu126"
    assert plan["torch"]["index"] == "https://download.pytorch.org/whl/cu126"
    assert plan["cuda"]["version"] == "12.6"
    torch_cmd = argv_of(step(plan, "install torch"))
    assert torch_cmd[-3:] == [
        build.TORCH_PIN + "+cu126",
        "--index-url",
        "https://download.pytorch.org/whl/cu126",
    ]
    assert argv_of(step(plan, "remove the other ORT flavours (same module name)"))[-2:] == [
        "onnxruntime",
        "onnxruntime-training",
    ]
    order = titles(plan)
    assert order.index("check torch is a CUDA build") < order.index("build the bridge")
    assert argv_of(step(plan, "build the bridge"))[-1] == "--use_cuda"
    assert "-DORT_LAZY_USE_CUDA=1" in plan["bridge"]["compiler_flags"]
    assert "onnxruntime-gpu" in argv_of(step(plan, "install dependencies"))


def test_plan_enable_training() -> None:
    plan = dry_run(
        "--no_venv", "--enable_training", "--enable_lazy_tensor", "--test", "--shards", "2", "--shard", "1"
    )
    assert plan["onnxruntime"] == {
        "flavour": "onnxruntime-training",
        "requirement": "onnxruntime-training==1.19.2",
    }
    assert argv_of(step(plan, "remove the other ORT flavours (same module name)"))[-2:] == [
        "onnxruntime",
        "onnxruntime-gpu",
    ]
    deps = argv_of(step(plan, "install dependencies"))
    assert "onnxruntime-training==1.19.2" in deps and "onnxruntime" not in deps
    assert argv_of(step(plan, "run the tests"))[-4:] == ["--shards", "2", "--shard", "1"]


def test_plan_torch_dir() -> None:
    import torch

    torch_dir = Path(torch.__file__).parent
    for given in (torch_dir, torch_dir.parent):  # the package or the site-packages holding it
        plan = dry_run("--no_venv", "--torch_dir", str(given), "--enable_lazy_tensor", "--test")
        assert plan["torch"]["found"]["version"] == torch.__version__
        assert plan["torch"]["found"]["source"] == "--torch_dir"
        assert plan["torch"]["install"] is None
        assert "install torch" not in titles(plan)
        bridge = argv_of(step(plan, "build the bridge"))
        assert bridge[bridge.index("--torch_dir") + 1] == str(torch_dir)
        assert step(plan, "run the tests")["env"]["PYTHONPATH"].startswith(str(torch_dir.parent))


def test_plan_build_wheel() -> None:
    plan = dry_run("--no_venv", "--skip_deps", "--enable_lazy_tensor", "--build_wheel")
    py, abi, platform = build.wheel_tags()
    wheel = ROOT / "dist" / f"ort_lazy-{package_version()}-{py}-{abi}-{platform}.whl"
    assert plan["wheel"] == str(wheel)
    assert titles(plan) == [
        "build the bridge",
        "record the build options in _bridge_build.json",
        "clear stale build files",
        "build the wheel",
        "tag the wheel for this platform (it holds a compiled extension)",
        "check the wheel's contents",
    ]
    assert argv_of(step(plan, "check the wheel's contents"))[-1] == str(wheel)
    tags = argv_of(step(plan, "tag the wheel for this platform (it holds a compiled extension)"))
    assert tags[-1].endswith("-py3-none-any.whl") and platform in tags

    installed = dry_run("--no_venv", "--skip_deps", "--enable_lazy_tensor", "--build_wheel", "--install")
    assert argv_of(step(installed, "install the wheel"))[-1] == str(wheel)
    assert "install ort-lazy (editable)" not in titles(installed)

    pure = dry_run("--no_venv", "--skip_deps", "--build_wheel")
    assert pure["wheel"].endswith(f"ort_lazy-{package_version()}-py3-none-any.whl")
    assert "build the bridge" not in titles(pure)


def test_plan_shards_skip_tests_config_parallel_nvtx() -> None:
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
    assert plan["tests"] == {"shards": 4, "shard": 3, "workers": "3"}

    skipped = dry_run("--no_venv", "--skip_deps", "--test", "--skip_tests", "--enable_lazy_tensor")
    assert "run the tests" not in titles(skipped) and "install ort-lazy (editable)" in titles(skipped)

    dbg = dry_run("--no_venv", "--skip_deps", "--enable_lazy_tensor", "--config", "Debug", "--parallel", "3")
    bridge = step(dbg, "build the bridge")
    assert (
        argv_of(bridge)[2:6] == ["--config", "Debug", "--parallel", "3"] and bridge["env"]["MAX_JOBS"] == "3"
    )
    assert {"-O0", "-g"} <= set(dbg["bridge"]["compiler_flags"]) and "-O3" not in dbg["bridge"][
        "compiler_flags"
    ]

    nvtx = dry_run("--no_venv", "--skip_deps", "--enable_lazy_tensor", "--enable_nvtx_profile")
    assert step(nvtx, "build the bridge")["env"][build.NVTX_ENV] == "1"
    assert (
        nvtx["bridge"]["nvtx_profile"] is True and f"-D{build.NVTX_ENV}=1" in nvtx["bridge"]["compiler_flags"]
    )

    demo = dry_run("--no_venv", "--skip_deps", "--demo")
    assert argv_of(step(demo, "run the demo"))[1:] == ["-m", "ort_lazy.cli", "demo"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--test", "--shards", "2", "--shard", "2"],
        ["--shards", "2", "--shard", "1"],
        ["--test", "--shards", "0"],
        ["--use_cuda", "--enable_training"],
        ["--cuda_version", "12.6"],
        ["--use_cuda", "--cuda_version", "twelve"],
        ["--torch_dir", "/nonexistent/torch"],
        ["--parallel", "0"],
        ["--config", "Fast"],
    ],
)
def test_bad_flag_combinations_are_refused(flags: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--dry_run", *flags], capture_output=True, text=True
    )
    assert out.returncode == 2 and "error:" in out.stderr


def test_use_cuda_without_toolkit_stops_before_building(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "--no_venv",
            "--skip_deps",
            "--enable_lazy_tensor",
            "--use_cuda",
            "--cuda_home",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "needs the CUDA toolkit" in out.stderr and "build_bridge" not in out.stdout


@pytest.mark.skipif(os.name == "nt", reason="the stand-in nvcc is a POSIX shell script")
def test_use_cuda_tests_without_gpu_stop_before_building(tmp_path: Path) -> None:
    if build.gpu_visible():
        pytest.skip("a GPU is visible here")
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.6, V12.6.77'\n")
    nvcc.chmod(0o755)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "--no_venv",
            "--skip_deps",
            "--enable_lazy_tensor",
            "--use_cuda",
            "--cuda_home",
            str(tmp_path),
            "--test",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "needs an NVIDIA GPU" in out.stderr and "+ " not in out.stdout
    mismatch = subprocess.run(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "--no_venv",
            "--skip_deps",
            "--use_cuda",
            "--cuda_home",
            str(tmp_path),
            "--cuda_version",
            "11.8",
        ],
        capture_output=True,
        text=True,
    )
    assert mismatch.returncode != 0 and "is CUDA 12.6" in mismatch.stderr


def test_check_cuda_torch_refuses_a_cpu_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build.parse_args(["--no_venv", "--use_cuda", "--cuda_version", "12.6"])
    monkeypatch.setattr(build, "find_torch", lambda a: {"version": "2.13.0+cpu", "cuda": None, "path": "/x"})
    with pytest.raises(SystemExit, match="CPU build"):
        build.check_cuda_torch(args)
    monkeypatch.setattr(
        build, "find_torch", lambda a: {"version": "2.13.0+cu118", "cuda": "11.8", "path": "/x"}
    )
    with pytest.raises(SystemExit, match="CUDA 11.8"):
        build.check_cuda_torch(args)
    monkeypatch.setattr(
        build, "find_torch", lambda a: {"version": "2.13.0+cu126", "cuda": "12.6", "path": "/x"}
    )
    build.check_cuda_torch(args)


def _wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_check_wheel(tmp_path: Path) -> None:
    record = json.dumps({"torch_version": "2.13.0+cpu"})
    so = "ort_lazy/_bridge.cpython-311-x86_64-linux-gnu.so"
    good = _wheel(
        tmp_path / "good.whl", {"ort_lazy/__init__.py": "", so: "", "ort_lazy/_bridge_build.json": record}
    )
    build.check_wheel(good, with_bridge=True)
    with pytest.raises(SystemExit, match="not ort_lazy/_bridge_build.json"):
        build.check_wheel(_wheel(tmp_path / "a.whl", {so: ""}), with_bridge=True)
    with pytest.raises(SystemExit, match="no compiled bridge"):
        build.check_wheel(_wheel(tmp_path / "b.whl", {"ort_lazy/__init__.py": ""}), with_bridge=True)
    with pytest.raises(SystemExit, match="records no torch version"):
        build.check_wheel(
            _wheel(tmp_path / "c.whl", {so: "", "ort_lazy/_bridge_build.json": "{}"}), with_bridge=True
        )
    with pytest.raises(SystemExit, match="earlier build"):
        build.check_wheel(good, with_bridge=False)
    with pytest.raises(SystemExit, match="was not built"):
        build.check_wheel(tmp_path / "missing.whl", with_bridge=False)


def test_record_bridge_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "_bridge_build.json"
    monkeypatch.setattr(build, "BRIDGE_RECORD", record)
    monkeypatch.setattr(build, "ROOT", tmp_path)
    monkeypatch.setattr(build, "find_torch", lambda a: {"version": "2.13.0+cpu", "cuda": None, "path": "/x"})
    args = build.parse_args(
        ["--no_venv", "--enable_lazy_tensor", "--enable_nvtx_profile", "--config", "RelWithDebInfo"]
    )
    with pytest.raises(SystemExit, match="wrote no"):
        build.record_bridge_build(args)
    record.write_text(json.dumps({"torch_version": "2.14.0+cpu"}))
    with pytest.raises(SystemExit, match="built for torch 2.14.0"):
        build.record_bridge_build(args)
    record.write_text(json.dumps({"torch_version": "2.13.0+cpu", "library": "_bridge.so"}))
    build.record_bridge_build(args)
    saved = json.loads(record.read_text())
    assert saved["torch_version"] == "2.13.0+cpu" and saved["library"] == "_bridge.so"
    assert saved["build_options"]["nvtx_profile"] is True
    assert saved["build_options"]["config"] == "RelWithDebInfo"
    assert saved["build_options"]["onnxruntime"] == "onnxruntime"


# --------------------------------------------------------------------------- conda recipe

SELECTORS = {
    "linux-64": {"linux": True, "unix": True, "x86_64": True},
    "linux-aarch64": {"linux": True, "unix": True, "aarch64": True},
    "win-64": {"win": True, "x86_64": True},
    "osx-arm64": {"osx": True, "unix": True, "arm64": True},
}


def render(platform: str, *variant_files: Path, variant_yaml: str | None = None) -> list[Any]:
    """Render recipe.yaml for ``platform``; drop variants the recipe's build.skip skips."""
    rb = pytest.importorskip(
        "rattler_build", reason="py-rattler-build is a test dependency (build.py installs it)"
    )
    plat = rb.PlatformConfig(target_platform=platform)
    if variant_yaml is not None:
        config = rb.VariantConfig.from_yaml(variant_yaml)
    else:
        config = rb.VariantConfig.from_files_with_context(
            [str(f) for f in variant_files], rb.JinjaConfig(platform=plat)
        )
    recipe = rb.Stage0Recipe.from_file(RECIPE)
    skips = recipe.build.to_dict().get("skip") or []
    selectors = {k: False for k in ("linux", "unix", "win", "osx", "x86_64", "aarch64", "arm64")}
    selectors.update(SELECTORS[platform])
    kept = []
    for variant in recipe.render(config, rb.RenderConfig(plat)):
        scope = {**selectors, **variant.variant}
        if not any(eval(expr, {"__builtins__": {}}, scope) for expr in skips):  # noqa: S307 - recipe selectors
            kept.append(variant)
    return kept


def requirements(variant: Any) -> dict[str, list[str]]:
    return variant.recipe.requirements.to_dict()


def by_name(specs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in specs:
        if isinstance(s, str):
            out.setdefault(s.split()[0], []).append(s)
    return out


@pytest.mark.parametrize("platform", ["linux-64", "win-64"])
def test_recipe_renders_exactly_cpu_and_cuda(platform: str) -> None:
    variants = render(platform, VARIANTS)
    assert len(variants) == 2
    cpu, cuda = sorted(variants, key=lambda v: v.recipe.build.string)
    assert re.fullmatch(r"cpu_py3\d+h[0-9a-f]{7}_0", cpu.recipe.build.string), cpu.recipe.build.string
    assert re.fullmatch(r"cuda1\d\d_py3\d+h[0-9a-f]{7}_200", cuda.recipe.build.string), (
        cuda.recipe.build.string
    )
    assert cuda.recipe.build.number == cpu.recipe.build.number + 200
    assert cpu.recipe.package.version == cuda.recipe.package.version == package_version()

    cpu_run, cuda_run = by_name(requirements(cpu)["run"]), by_name(requirements(cuda)["run"])
    torch_pin = f"=={build.TORCH_PIN.split('==')[1]}"
    assert cpu_run["pytorch"] == [f"pytorch {torch_pin} cpu*"]
    assert cuda_run["pytorch"] == [f"pytorch {torch_pin} cuda*"]
    assert [conda_requirement(s)[2] for s in cpu_run["onnxruntime"]] == [None]
    assert [conda_requirement(s)[2] for s in cuda_run["onnxruntime"]] == ["*cuda*"]
    assert "__cuda" in cuda_run and "__cuda" not in cpu_run
    # the bridge is compiled against the host pytorch: run pins exactly that one
    assert by_name(requirements(cpu)["host"])["pytorch"] == cpu_run["pytorch"]
    assert by_name(requirements(cuda)["host"])["pytorch"] == cuda_run["pytorch"]

    cuda_build = " ".join(requirements(cuda)["build"])
    assert f"cuda-nvcc_{platform}" in cuda_build and "cuda-nvcc" not in " ".join(requirements(cpu)["build"])
    assert any(s.startswith("cuda-version ==") for s in requirements(cuda)["host"])


def test_recipe_osx_arm64_is_cpu_only() -> None:
    variants = render("osx-arm64", VARIANTS)
    assert [v.recipe.build.string.split("_")[0] for v in variants] == ["cpu"]
    # the recipe itself skips CUDA on macOS and non-x86_64 Linux, whatever the variant config says
    both = (
        "cuda_compiler: [None, cuda-nvcc]\ncuda_compiler_version: [None, '12.6']\n"
        "zip_keys: [[cuda_compiler, cuda_compiler_version]]\npython: ['3.12']\npytorch: ['2.13.0']\n"
        "c_stdlib: [sysroot]\nc_stdlib_version: ['2.28']\n"
    )
    assert [v.recipe.build.string.split("_")[0] for v in render("osx-arm64", variant_yaml=both)] == ["cpu"]
    assert render("linux-aarch64", variant_yaml=both) == []
    assert len(render("linux-64", variant_yaml=both)) == 2


def test_recipe_run_requirements_match_pyproject() -> None:
    (cpu,) = render("linux-64", VARIANTS, ROOT / "ci" / "conda" / "cpu.yaml")
    run = {conda_requirement(s)[0]: conda_requirement(s)[1] for s in requirements(cpu)["run"]}
    for name, specifiers in project_requirements().items():
        conda = CONDA_NAMES.get(name, name)
        assert conda in run, f"{name} missing from the recipe's run requirements"
        if name != "torch":  # the recipe pins the exact pytorch the bridge was built against
            assert run[conda] == specifiers, (name, run[conda], specifiers)
    torch_spec = project_requirements()["torch"]
    pinned = next(iter(run["pytorch"])).lstrip("=")
    from packaging.specifiers import SpecifierSet

    assert pinned in SpecifierSet(",".join(torch_spec)), (pinned, torch_spec)


def test_recipe_build_script_calls_build_py() -> None:
    for variant in render("linux-64", VARIANTS) + render("win-64", VARIANTS):
        script = variant.recipe.build.script
        content = script["content"] if isinstance(script, dict) else script
        line = content if isinstance(content, str) else " ".join(content)
        argv = shlex.split(line.replace("%", ""))
        assert Path(argv[1]).name == "build.py", line
        rest = [a.replace("$CPU_COUNT", "4").replace("CPU_COUNT", "4") for a in argv[2:]]
        rest = [
            a.replace("$CUDA_COMPILER_VERSION", "12.6").replace("CUDA_COMPILER_VERSION", "12.6") for a in rest
        ]
        args = build.parse_args(rest)
        assert (
            args.no_venv and args.skip_deps and args.enable_lazy_tensor and args.install and args.build_wheel
        )
        cuda = variant.variant.get("cuda_compiler_version", "None") != "None"
        assert args.use_cuda == cuda
        if cuda:
            assert script["env"]["CUDA_COMPILER_VERSION"] == variant.variant["cuda_compiler_version"]


def test_recipe_tests_check_import_bridge_parity_and_cuda_ep() -> None:
    test_script = (ROOT / "recipe" / "run_test.py").read_text()
    for needle in (
        "_bridge_build.json",
        "import _bridge",
        "assert_close",
        "CUDAExecutionProvider",
        '"--cuda"',
    ):
        assert needle in test_script
    for variant in render("linux-64", VARIANTS):
        tests = variant.recipe.to_dict()["tests"]
        imports = [t["python"]["imports"] for t in tests if "python" in t]
        assert imports and "ort_lazy" in imports[0]
        scripts = [t["script"] for t in tests if "script" in t]
        cuda = variant.variant.get("cuda_compiler_version", "None") != "None"
        assert scripts == [["python run_test.py --cuda"] if cuda else ["python run_test.py"]] or scripts == [
            "python run_test.py --cuda" if cuda else "python run_test.py"
        ]


@pytest.mark.parametrize(("name", "kind"), [("cpu", "cpu"), ("cuda", "cuda126")])
def test_ci_variant_files_select_one_variant(name: str, kind: str) -> None:
    for platform in ("linux-64", "win-64"):
        (variant,) = render(platform, VARIANTS, ROOT / "ci" / "conda" / f"{name}.yaml")
        assert variant.recipe.build.string.startswith(kind + "_")


# --------------------------------------------------------------------------- environment.yml


def test_environment_yml_matches_pyproject() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "ort-lazy" and "conda-forge" in env["channels"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [p for d in env["dependencies"] if isinstance(d, dict) for p in d.get("pip", [])]
    have = {conda_requirement(s)[0]: conda_requirement(s) for s in conda}
    have_pip = dict(pip_requirement(p) for p in pip)
    for name, specifiers in project_requirements("test", "build").items():
        conda_name = CONDA_NAMES.get(name, name)
        if conda_name in have:
            assert have[conda_name][1] == specifiers, (name, have[conda_name][1], specifiers)
        else:
            assert name in have_pip, f"{name} (pyproject) missing from environment.yml"
            assert have_pip[name] == specifiers, (name, have_pip[name], specifiers)
    assert have["pytorch"][2] == "cpu*", "the development environment is the CPU one"
    lower = PYPROJECT["project"]["requires-python"]
    assert lower in have["python"][1], (lower, have["python"][1])


# --------------------------------------------------------------------------- CI workflow


def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def expand_matrix(matrix: dict[str, Any]) -> list[dict[str, Any]]:
    axes = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else []
    combos = [
        c
        for c in combos
        if not any(all(c.get(k) == v for k, v in ex.items()) for ex in matrix.get("exclude", []))
    ]
    return combos + list(matrix.get("include", []))


def substitute(text: str, context: dict[str, Any]) -> str:
    def value(m: re.Match[str]) -> str:
        node: Any = context
        for part in m.group(1).split("."):
            node = node[part]
        return str(node)

    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", value, text)


def build_py_invocations(job: dict[str, Any], env: dict[str, str]) -> list[tuple[dict[str, Any], Any]]:
    combos = expand_matrix(job.get("strategy", {}).get("matrix", {})) or [{}]
    found = []
    for combo in combos:
        for s in job["steps"]:
            run = s.get("run", "")
            for line in run.replace("\\\n", " ").splitlines() if "\n" in run.strip() else [run]:
                if "build.py" not in line:
                    continue
                argv = shlex.split(substitute(line, {"matrix": combo, "env": env}))
                rest = argv[argv.index("build.py") + 1 :]
                found.append((combo, build.parse_args(rest)))
    return found


def test_workflow_parses_and_has_the_jobs() -> None:
    wf = workflow()
    assert set(wf["jobs"]) >= {"lint", "test", "training", "wheel", "conda"}
    lint = " ".join(s.get("run", "") for s in wf["jobs"]["lint"]["steps"])
    assert "ruff check" in lint


def test_workflow_test_matrix() -> None:
    wf = workflow()
    matrix = wf["jobs"]["test"]["strategy"]["matrix"]
    assert matrix["python"] == ["3.10", "3.11", "3.12", "3.13"]
    assert matrix["torch"] == ["2.13", "2.14"]
    assert {b["name"] for b in matrix["bridge"]} == {"on", "off"}
    assert "ubuntu-latest" in matrix["os"]
    assert any(inc["os"].startswith("windows") for inc in matrix["include"])
    shards = int(wf["env"]["SHARDS"])
    assert matrix["shard"] == list(range(shards))
    runs = build_py_invocations(wf["jobs"]["test"], wf["env"])
    assert len(runs) == len(expand_matrix(matrix)) > 32
    covered: dict[tuple, set[int]] = {}
    for combo, args in runs:
        assert args.test and not args.skip_tests and args.shards == shards and args.shard == combo["shard"]
        assert args.enable_lazy_tensor == (combo["bridge"]["name"] == "on")
        assert args.torch_spec == f"torch=={combo['torch']}.*"
        assert args.torch_index == wf["env"]["TORCH_CPU_INDEX"]
        key = (combo["os"], combo["python"], combo["torch"], combo["bridge"]["name"])
        covered.setdefault(key, set()).add(args.shard)
    assert all(s == set(range(shards)) for s in covered.values()), "every configuration runs every shard"


def test_workflow_training_wheel_and_conda_jobs() -> None:
    wf = workflow()
    training = build_py_invocations(wf["jobs"]["training"], wf["env"])
    assert training and all(
        a.enable_training and a.test and a.shards == int(wf["env"]["SHARDS"]) for _, a in training
    )
    assert {a.shard for _, a in training} == set(range(int(wf["env"]["SHARDS"])))
    wheel = build_py_invocations(wf["jobs"]["wheel"], wf["env"])
    assert wheel and all(a.build_wheel and a.enable_lazy_tensor for _, a in wheel)
    assert any("run_test.py" in s.get("run", "") for s in wf["jobs"]["wheel"]["steps"])

    conda = wf["jobs"]["conda"]
    combos = expand_matrix(conda["strategy"]["matrix"])
    assert {(c["variant"], c["platform"]) for c in combos} == {
        ("cpu", "linux-64"),
        ("cuda", "linux-64"),
        ("cpu", "win-64"),
        ("cuda", "win-64"),
        ("cpu", "osx-arm64"),
    }
    (step_,) = [s for s in conda["steps"] if "rattler-build" in s.get("uses", "")]
    assert step_["with"]["recipe-path"] == "recipe/recipe.yaml"
    for combo in combos:
        argv = shlex.split(substitute(step_["with"]["build-args"], {"matrix": combo, "env": wf["env"]}))
        files = [argv[i + 1] for i, a in enumerate(argv) if a == "-m"]
        assert files == ["recipe/variants.yaml", f"ci/conda/{combo['variant']}.yaml"]
        assert all((ROOT / f).is_file() for f in files)
        assert argv[argv.index("--target-platform") + 1] == combo["platform"]


def test_github_workflow_is_the_ci_copy():
    """GitHub runs workflows only from .github/workflows: it must be the ci/ matrix, unchanged."""
    root = Path(__file__).resolve().parents[1]
    assert (root / ".github/workflows/build.yml").read_text() == (root / "ci/workflows/build.yml").read_text()

#!/usr/bin/env python3
"""ort-lazy build driver: set up, build the bridge, install, wheel, test, run the demo.

Run it with any Python >= 3.10. Unless it already runs inside a virtual environment (or
``--no_venv`` is given), it creates ``.venv`` next to this file, installs the pinned
dependencies there and re-runs itself with that interpreter, so one command does all set-up.

Examples::

    python3 build.py --enable_lazy_tensor --demo     # set up, build, run `ort-lazy demo`
    python3 build.py --enable_lazy_tensor --test     # set up, build, run the test suite
    python3 build.py --enable_lazy_tensor --build_wheel          # wheel into dist/
    python3 build.py --enable_lazy_tensor --test --shards 4 --shard 1   # one CI shard
    python3 build.py --dry_run --use_cuda --enable_lazy_tensor   # print the plan (JSON) only

ORT flavours: ``onnxruntime`` (default), ``onnxruntime-gpu`` (``--use_cuda``) and
``onnxruntime-training==1.19.2`` (``--enable_training``). They share the import name
``onnxruntime``, so the plan removes the other two before installing the chosen one.

Packaging (conda) builds call ``build.py --no_venv --skip_deps --enable_lazy_tensor
--build_wheel --install``: the bridge is compiled against the environment's torch, the wheel
is checked to hold ``ort_lazy/_bridge_build.json`` (the exact torch version the bridge was
built against) and then installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = ROOT / "src" / "ort_lazy"
BRIDGE_RECORD = PACKAGE_DIR / "_bridge_build.json"
DIST = ROOT / "dist"
#: The torch every install path pins (a newer or unpinned torch pulls a multi-GB CUDA wheel).
TORCH_PIN = "torch==2.13.0"
ORT_FLAVOURS = {"cpu": "onnxruntime", "cuda": "onnxruntime-gpu", "training": "onnxruntime-training==1.19.2"}
BASE_DEPS = ["onnx", "onnxscript", "onnx-ir", "numpy", "pybind11", "setuptools", "wheel"]
TEST_DEPS = [
    "pytest",
    "pytest-xdist",
    "ruff",
    "pyyaml",
    "py-rattler-build",
    "import-linter",
    # PyTorch's operator database (torch.testing._internal) imports these
    "expecttest",
    "hypothesis",
    # the real-model zoo: random-weight configs, no downloads
    "transformers==5.24.0",
    "huggingface-hub",
    "safetensors",
]
#: test packages installed without their dependencies: timm asks for torchvision, whose PyPI
#: wheel is CUDA-linked and would replace the pinned CPU torch
TEST_DEPS_NO_DEPS = ["timm==1.0.31"]
CONFIGS = ("Debug", "Release", "RelWithDebInfo")
#: CUDA used to pick torch's wheel index when neither --cuda_version nor nvcc says otherwise.
DEFAULT_CUDA = "12.6"
TORCH_WHEEL_INDEX = "https://download.pytorch.org/whl/{tag}"
#: Optimisation flags per --config when cpp/build_bridge.py (whose CONFIGS wins) is absent.
CONFIG_FLAGS = {
    "Debug": ["-O0", "-g"],
    "Release": ["-O3", "-DNDEBUG"],
    "RelWithDebInfo": ["-O2", "-g", "-DNDEBUG"],
}
#: Environment variable the bridge build reads to compile NVTX ranges in (-DORT_LAZY_ENABLE_NVTX=1).
NVTX_ENV = "ORT_LAZY_ENABLE_NVTX"
EXTENSION_SUFFIXES = (".so", ".pyd", ".dylib")


# --------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = p.add_argument_group("environment")
    g.add_argument(
        "--venv", default=str(ROOT / ".venv"), help="virtual environment to create/use (default: .venv)"
    )
    g.add_argument(
        "--no_venv", action="store_true", help="use the running interpreter as is (conda builds, CI images)"
    )
    g.add_argument("--skip_deps", action="store_true", help="do not pip-install or remove any dependency")
    g.add_argument(
        "--torch_spec", default=TORCH_PIN, help=f"pip requirement for torch (default: {TORCH_PIN})"
    )
    g.add_argument(
        "--torch_index",
        default=None,
        help="pip index torch is installed from (default: pip's own; with --use_cuda the "
        "download.pytorch.org CUDA index for --cuda_version; CI passes the CPU index)",
    )
    g.add_argument(
        "--torch_dir",
        default=None,
        metavar="PATH",
        help="compile the bridge against the torch at PATH (a torch package directory or a "
        "site-packages holding one) instead of the importable one; PATH's torch is also put first "
        "on PYTHONPATH for the tests and demo, and no torch is pip-installed",
    )
    b = p.add_argument_group("build")
    b.add_argument(
        "--enable_lazy_tensor",
        action="store_true",
        help="build the pybind11 LazyTensor/TorchScript bridge (cpp/) into the package",
    )
    b.add_argument(
        "--use_cuda",
        action="store_true",
        help="build against a CUDA torch and pair it with onnxruntime-gpu; stops before building "
        "when no CUDA toolkit (nvcc) is found, or no GPU is visible and --test/--demo would run",
    )
    b.add_argument(
        "--cuda_home",
        default=None,
        metavar="PATH",
        help="CUDA toolkit root (default: CUDA_HOME, CUDA_PATH, nvcc on PATH)",
    )
    b.add_argument(
        "--cuda_version",
        default=None,
        metavar="X.Y",
        help="CUDA version to build for, e.g. 12.6; must match nvcc",
    )
    b.add_argument(
        "--enable_training",
        action="store_true",
        help="pair the build with onnxruntime-training==1.19.2 instead of onnxruntime",
    )
    b.add_argument(
        "--enable_nvtx_profile",
        action="store_true",
        help=f"compile NVTX ranges around export, session creation and runs (CUDA): sets {NVTX_ENV}=1 "
        "for the bridge build and records it in _bridge_build.json",
    )
    b.add_argument(
        "--config", default="Release", choices=CONFIGS, help="bridge build type (default: Release)"
    )
    b.add_argument(
        "--parallel",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="parallel compile jobs (default: all cores)",
    )
    b.add_argument(
        "--build_wheel",
        action="store_true",
        help="build a wheel into dist/; with the bridge it is tagged for this platform and checked "
        "to hold the bridge and the torch version it was built against",
    )
    b.add_argument(
        "--install",
        action="store_true",
        help="install ort-lazy into the environment: editable, or the built wheel (not editable) with "
        "--build_wheel; implied by --test and --demo",
    )
    t = p.add_argument_group("run")
    t.add_argument("--test", action="store_true", help="run the test suite (pytest -n WORKERS)")
    t.add_argument(
        "--skip_tests", action="store_true", help="never run tests, even with --test (set-up only)"
    )
    t.add_argument(
        "--shards", type=int, default=1, metavar="N", help="split the test suite into N deterministic shards"
    )
    t.add_argument("--shard", type=int, default=0, metavar="I", help="run shard I (0-based) of --shards")
    t.add_argument("--workers", default="2", help="pytest-xdist workers inside the shard (default 2)")
    t.add_argument("--demo", action="store_true", help="run `ort-lazy demo` after building")
    t.add_argument(
        "--dry_run",
        action="store_true",
        help="print the plan as JSON (commands, compiler flags, torch found, ORT flavour) and exit",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.shards < 1:
        p.error(f"--shards must be >= 1, got {args.shards}")
    if not 0 <= args.shard < args.shards:
        p.error(f"--shard must be in [0, {args.shards}), got {args.shard}")
    if args.parallel < 1:
        p.error(f"--parallel must be >= 1, got {args.parallel}")
    if args.use_cuda and args.enable_training:
        p.error(
            "--use_cuda and --enable_training pick different ORT packages that share the module "
            "`onnxruntime`; choose one"
        )
    if args.cuda_version is not None:
        if not args.use_cuda:
            p.error("--cuda_version needs --use_cuda")
        if not re.fullmatch(r"\d+\.\d+", args.cuda_version):
            p.error(f"--cuda_version must look like 12.6, got {args.cuda_version!r}")
    if args.cuda_home is not None and not args.use_cuda:
        p.error("--cuda_home needs --use_cuda")
    if args.torch_dir is not None:
        try:
            args.torch_dir = str(torch_package_dir(Path(args.torch_dir)))
        except FileNotFoundError as e:
            p.error(str(e))
    if args.shards > 1 and not args.test:
        p.error("--shards/--shard select tests: add --test")
    return args


# --------------------------------------------------------------------------- probes


def in_venv() -> bool:
    return sys.prefix != sys.base_prefix


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def uses_venv(args: argparse.Namespace) -> bool:
    return not args.no_venv and not in_venv()


def target_python(args: argparse.Namespace) -> str:
    """The interpreter the plan's commands run with."""
    return str(venv_python(Path(args.venv))) if uses_venv(args) else sys.executable


def torch_package_dir(path: Path) -> Path:
    """The torch package directory PATH names (the package itself or a directory holding it)."""
    for candidate in (path, path / "torch"):
        if (candidate / "version.py").is_file() and (candidate / "__init__.py").is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"--torch_dir {path}: no torch package there (expected version.py in it or in torch/)"
    )


def read_torch_version_file(package_dir: Path) -> dict[str, Any]:
    """Version facts from torch/version.py, read without importing torch."""
    text = (package_dir / "version.py").read_text()

    def field_of(name: str) -> str | None:
        m = re.search(rf"^{name}\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
        return m.group(1) if m else None

    return {"version": field_of("__version__"), "cuda": field_of("cuda"), "path": str(package_dir)}


_PROBE = (
    "import importlib.util, json; s = importlib.util.find_spec('torch'); "
    "print(json.dumps(None if s is None or not s.submodule_search_locations else list(s.submodule_search_locations)[0]))"
)


def find_torch(args: argparse.Namespace) -> dict[str, Any] | None:
    """The torch the bridge would be compiled against: --torch_dir's, else the target interpreter's."""
    if args.torch_dir:
        return {**read_torch_version_file(Path(args.torch_dir)), "source": "--torch_dir"}
    python = target_python(args)
    if not Path(python).exists():
        return None
    out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        return None
    location = json.loads(out.stdout)
    if location is None or not (Path(location) / "version.py").is_file():
        return None
    return {**read_torch_version_file(Path(location)), "source": python}


def find_nvcc(args: argparse.Namespace) -> Path | None:
    """nvcc of --cuda_home, CUDA_HOME, CUDA_PATH, /usr/local/cuda, else the one on PATH."""
    exe = "nvcc.exe" if os.name == "nt" else "nvcc"
    homes = [args.cuda_home] if args.cuda_home else [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if os.name != "nt" and not args.cuda_home:
        homes.append("/usr/local/cuda")
    for home in homes:
        if home and (Path(home) / "bin" / exe).is_file():
            return Path(home) / "bin" / exe
    found = shutil.which("nvcc") if not args.cuda_home else None
    return Path(found) if found else None


def cuda_home(nvcc: Path) -> str:
    return str(nvcc.resolve().parent.parent)


def nvcc_version(nvcc: Path) -> str | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def gpu_visible() -> bool:
    """True when an NVIDIA GPU (and its driver) is visible to this process."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
            return out.returncode == 0 and "GPU" in out.stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def package_version() -> str:
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', (PACKAGE_DIR / "_version.py").read_text(), re.M)
    if not m:
        raise SystemExit("build.py: no __version__ in src/ort_lazy/_version.py")
    return m.group(1)


# --------------------------------------------------------------------------- the plan


def ort_requirement(args: argparse.Namespace) -> str:
    if args.enable_training:
        return ORT_FLAVOURS["training"]
    return ORT_FLAVOURS["cuda" if args.use_cuda else "cpu"]


def ort_flavour(args: argparse.Namespace) -> str:
    return re.split(r"[=<>!~ ]", ort_requirement(args))[0]


def cuda_version(args: argparse.Namespace) -> str | None:
    """--cuda_version, else nvcc's, else DEFAULT_CUDA (only with --use_cuda)."""
    if not args.use_cuda:
        return None
    if args.cuda_version:
        return args.cuda_version
    nvcc = find_nvcc(args)
    return (nvcc_version(nvcc) if nvcc else None) or DEFAULT_CUDA


def torch_index(args: argparse.Namespace) -> str | None:
    if args.torch_index:
        return args.torch_index
    if args.use_cuda:
        return TORCH_WHEEL_INDEX.format(tag="cu" + (cuda_version(args) or DEFAULT_CUDA).replace(".", ""))
    return None


def torch_requirement(args: argparse.Namespace) -> str:
    """--torch_spec; with --use_cuda an exact pin gets the CUDA local version (torch==2.13.0+cu126),
    so an installed CPU build of the same version does not satisfy it."""
    if args.use_cuda and re.fullmatch(r"torch==\d+(\.\d+)*", args.torch_spec):
        return args.torch_spec + "+cu" + (cuda_version(args) or DEFAULT_CUDA).replace(".", "")
    return args.torch_spec


def bridge_config_flags() -> dict[str, list[str]]:
    """The bridge build's own --config -> flags table (cpp/build_bridge.py CONFIGS), else CONFIG_FLAGS."""
    path = ROOT / "cpp" / "build_bridge.py"
    if path.is_file():
        spec = importlib.util.spec_from_file_location("_ort_lazy_build_bridge", path)
        if spec and spec.loader:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # stdlib-only at import time
            configs = getattr(module, "CONFIGS", None)
            if isinstance(configs, dict):
                return {k: list(v) for k, v in configs.items()}
    return dict(CONFIG_FLAGS)


def compiler_flags(args: argparse.Namespace, torch_version: str | None = None) -> list[str]:
    """The compile flags of the bridge for --config, --use_cuda and --enable_nvtx_profile."""
    flags = ["-std=c++17", *bridge_config_flags()[args.config]]
    if torch_version:
        flags.append(f'-DORT_LAZY_TORCH_VERSION="{torch_version}"')
    if args.use_cuda:
        flags.append("-DORT_LAZY_USE_CUDA=1")
    if args.enable_nvtx_profile:
        flags.append(f"-D{NVTX_ENV}=1")
    return flags


def wheel_tags() -> tuple[str, str, str]:
    """(python, abi, platform) tags of a wheel holding a CPython extension built here."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return py, py, re.sub(r"[-.]", "_", sysconfig.get_platform())


def wheel_path(args: argparse.Namespace) -> Path:
    name = f"ort_lazy-{package_version()}"
    if args.enable_lazy_tensor:
        return DIST / (name + "-{}-{}-{}.whl".format(*wheel_tags()))
    return DIST / f"{name}-py3-none-any.whl"


@dataclass
class Step:
    """One thing the build does: a command, or an action of this script (``action`` set)."""

    title: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    action: Callable[[], None] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "cmd": shlex.join(self.cmd),
            "env": self.env,
            "internal": self.action is not None,
        }


def step_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment every step after set-up runs with."""
    env: dict[str, str] = {}
    if args.torch_dir:
        site = str(Path(args.torch_dir).parent)
        env["PYTHONPATH"] = os.pathsep.join([site, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def plan(args: argparse.Namespace, py: str | None = None) -> list[Step]:
    """Everything this invocation does, in order (what --dry_run prints)."""
    py = py or target_python(args)
    pip = [py, "-m", "pip"]
    env = step_env(args)
    steps: list[Step] = []
    if uses_venv(args) and not venv_python(Path(args.venv)).exists():
        steps.append(Step("create the virtual environment", [sys.executable, "-m", "venv", args.venv]))
        steps.append(Step("upgrade pip", [*pip, "install", "-q", "--upgrade", "pip"]))
    if not args.skip_deps:
        others = [
            name
            for name in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-training")
            if name != ort_flavour(args)
        ]
        steps.append(
            Step("remove the other ORT flavours (same module name)", [*pip, "uninstall", "-y", "-q", *others])
        )
        if not args.torch_dir:  # with --torch_dir that torch is used as it is
            index = torch_index(args)
            spec = torch_requirement(args)
            steps.append(
                Step(
                    "install torch", [*pip, "install", "-q", spec, *(["--index-url", index] if index else [])]
                )
            )
        deps = [ort_requirement(args), *BASE_DEPS]
        if args.test:
            deps += TEST_DEPS
        steps.append(Step("install dependencies", [*pip, "install", "-q", *deps]))
        if args.test:
            steps.append(
                Step("install test models (without torchvision)", [*pip, "install", "-q", "--no-deps", *TEST_DEPS_NO_DEPS])
            )
    if args.use_cuda:
        steps.append(
            Step(
                "check torch is a CUDA build",
                ["build.py:check_cuda_torch"],
                action=lambda: check_cuda_torch(args),
            )
        )
    if args.enable_lazy_tensor:
        cmd = [
            py,
            str(ROOT / "cpp" / "build_bridge.py"),
            "--config",
            args.config,
            "--parallel",
            str(args.parallel),
        ]
        if args.torch_dir:
            cmd += ["--torch_dir", args.torch_dir]
        if args.use_cuda:
            cmd += ["--use_cuda"]
        bridge_env = {**env, "MAX_JOBS": str(args.parallel)}
        if args.enable_nvtx_profile:
            bridge_env[NVTX_ENV] = "1"
        if args.use_cuda:
            nvcc = find_nvcc(args)
            if nvcc:
                bridge_env["CUDA_HOME"] = cuda_home(nvcc)
        steps.append(Step("build the bridge", cmd, bridge_env))
        steps.append(
            Step(
                "record the build options in _bridge_build.json",
                ["build.py:record_bridge_build", str(BRIDGE_RECORD)],
                action=lambda: record_bridge_build(args),
            )
        )
    install = args.install or args.test or args.demo
    if args.build_wheel:
        steps.append(
            Step(
                "clear stale build files",
                ["build.py:clean", str(ROOT / "build"), str(DIST)],
                action=clean_wheel_build,
            )
        )
        steps.append(
            Step(
                "build the wheel",
                [*pip, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(DIST), str(ROOT)],
                env,
            )
        )
        if args.enable_lazy_tensor:
            pure = DIST / f"ort_lazy-{package_version()}-py3-none-any.whl"
            pyt, abi, plat = wheel_tags()
            steps.append(
                Step(
                    "tag the wheel for this platform (it holds a compiled extension)",
                    [
                        py,
                        "-m",
                        "wheel",
                        "tags",
                        "--remove",
                        "--python-tag",
                        pyt,
                        "--abi-tag",
                        abi,
                        "--platform-tag",
                        plat,
                        str(pure),
                    ],
                )
            )
        steps.append(
            Step(
                "check the wheel's contents",
                ["build.py:check_wheel", str(wheel_path(args))],
                action=lambda: check_wheel(wheel_path(args), args.enable_lazy_tensor),
            )
        )
        if install:
            steps.append(
                Step(
                    "install the wheel",
                    [*pip, "install", "-q", "--no-deps", "--force-reinstall", str(wheel_path(args))],
                    env,
                )
            )
    elif install:
        steps.append(
            Step(
                "install ort-lazy (editable)",
                [*pip, "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(ROOT)],
                env,
            )
        )
    if args.test and not args.skip_tests:
        steps.append(Step("run the tests", test_command(args, py), env))
    if args.demo:
        steps.append(Step("run the demo", [py, "-m", "ort_lazy.cli", "demo"], env))
    return steps


def test_command(args: argparse.Namespace, py: str) -> list[str]:
    cmd = [py, "-m", "pytest", "-q", "-n", str(args.workers), str(ROOT / "tests")]
    if args.shards > 1:
        cmd += ["--shards", str(args.shards), "--shard", str(args.shard)]
    return cmd


def describe(args: argparse.Namespace) -> dict[str, Any]:
    """The plan as data: what --dry_run prints."""
    nvcc = find_nvcc(args) if args.use_cuda else None
    torch = find_torch(args)
    return {
        "python": target_python(args),
        "venv": args.venv if uses_venv(args) else None,
        "torch": {
            "found": torch,
            "install": None if args.torch_dir or args.skip_deps else torch_requirement(args),
            "index": None if args.torch_dir or args.skip_deps else torch_index(args),
        },
        "onnxruntime": {"flavour": ort_flavour(args), "requirement": ort_requirement(args)},
        "bridge": {
            "enabled": args.enable_lazy_tensor,
            "config": args.config,
            "parallel": args.parallel,
            "compiler_flags": compiler_flags(args, torch and torch["version"])
            if args.enable_lazy_tensor
            else [],
            "nvtx_profile": args.enable_nvtx_profile,
        },
        "cuda": None
        if not args.use_cuda
        else {
            "version": cuda_version(args),
            "nvcc": str(nvcc) if nvcc else None,
            "gpu_visible": gpu_visible(),
        },
        "wheel": str(wheel_path(args)) if args.build_wheel else None,
        "tests": None
        if not args.test or args.skip_tests
        else {"shards": args.shards, "shard": args.shard, "workers": args.workers},
        "steps": [s.describe() for s in plan(args)],
    }


# --------------------------------------------------------------------------- actions


def check_training(args: argparse.Namespace) -> None:
    """onnxruntime-training stopped at 1.19.2, which has no wheels past Python 3.12."""
    if args.enable_training and not args.skip_deps and sys.version_info >= (3, 13):
        sys.exit(
            f"build.py: --enable_training installs {ORT_FLAVOURS['training']}, which has no wheels for "
            f"Python {sys.version_info.major}.{sys.version_info.minor}; use Python 3.10-3.12"
        )


def check_cuda(args: argparse.Namespace) -> None:
    """Stop before building when --use_cuda cannot work here."""
    if not args.use_cuda:
        return
    nvcc = find_nvcc(args)
    if nvcc is None:
        sys.exit(
            "build.py: --use_cuda needs the CUDA toolkit, and no nvcc was found "
            "(looked in --cuda_home, CUDA_HOME, CUDA_PATH and PATH). Install the toolkit or drop --use_cuda."
        )
    found = nvcc_version(nvcc)
    if args.cuda_version and found and found != args.cuda_version:
        sys.exit(f"build.py: --cuda_version {args.cuda_version} but {nvcc} is CUDA {found}")
    if (args.test and not args.skip_tests or args.demo) and not gpu_visible():
        sys.exit(
            "build.py: --use_cuda with --test/--demo needs an NVIDIA GPU, and none is visible "
            "(nvidia-smi -L lists none). Build only (drop --test/--demo) or run on a GPU machine."
        )


def check_cuda_torch(args: argparse.Namespace) -> None:
    """--use_cuda builds against a CUDA torch: stop before building the bridge if it is not one."""
    torch = find_torch(args)
    if torch is None:
        sys.exit("build.py: --use_cuda: no torch found to build against")
    if not torch["cuda"]:
        sys.exit(
            f"build.py: --use_cuda needs a CUDA build of torch, but torch {torch['version']} at {torch['path']} "
            f"is a CPU build (install {torch_requirement(args)} from {torch_index(args)}, or pass --torch_dir)"
        )
    want = cuda_version(args)
    if want and torch["cuda"].split(".")[0] != want.split(".")[0]:
        sys.exit(
            f"build.py: torch {torch['version']} was built with CUDA {torch['cuda']}, the toolkit is CUDA {want}"
        )


def read_record() -> dict[str, Any]:
    if not BRIDGE_RECORD.is_file():
        sys.exit(f"build.py: the bridge build wrote no {BRIDGE_RECORD.relative_to(ROOT)}")
    return json.loads(BRIDGE_RECORD.read_text())


def recorded_torch(record: dict[str, Any]) -> str | None:
    value = record.get("torch_version", record.get("torch"))
    if isinstance(value, dict):
        value = value.get("version")
    return value if isinstance(value, str) else None


def record_bridge_build(args: argparse.Namespace) -> None:
    """Check the bridge's record names the torch it was built against; add this build's options."""
    record = read_record()
    built_for = recorded_torch(record)
    if built_for is None:
        sys.exit(f"build.py: {BRIDGE_RECORD.name} records no torch version: {record}")
    torch = find_torch(args)
    if torch and torch["version"] != built_for:
        sys.exit(
            f"build.py: the bridge was built for torch {built_for} but the build's torch is {torch['version']}"
        )
    record["build_options"] = {
        "config": args.config,
        "use_cuda": args.use_cuda,
        "cuda_version": cuda_version(args),
        "nvtx_profile": args.enable_nvtx_profile,
        "onnxruntime": ort_requirement(args),
        "compiler_flags": compiler_flags(args, built_for),
    }
    BRIDGE_RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(
        f"build.py: bridge built for torch {built_for}; options recorded in {BRIDGE_RECORD.name}", flush=True
    )


def clean_wheel_build() -> None:
    """Old files under build/ or an old wheel of this version would end up in (or shadow) the new wheel."""
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    for old in DIST.glob(f"ort_lazy-{package_version()}-*.whl"):
        old.unlink()


def check_wheel(path: Path, with_bridge: bool) -> None:
    """The wheel exists, and with the bridge holds it plus the torch version it was built against."""
    if not path.is_file():
        sys.exit(f"build.py: expected wheel {path} was not built")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        extensions = [n for n in names if n.startswith("ort_lazy/") and n.endswith(EXTENSION_SUFFIXES)]
        has_record = "ort_lazy/_bridge_build.json" in names
        if with_bridge and not extensions:
            sys.exit(f"build.py: {path.name} holds no compiled bridge")
        if extensions and not with_bridge:
            sys.exit(
                f"build.py: {path.name} would hold a bridge from an earlier build ({', '.join(extensions)}) "
                "under a pure-Python tag: add --enable_lazy_tensor, or delete it from src/ort_lazy/"
            )
        if (with_bridge or extensions) and not has_record:
            sys.exit(f"build.py: {path.name} holds the bridge but not ort_lazy/_bridge_build.json")
        if has_record:
            in_wheel = recorded_torch(json.loads(zf.read("ort_lazy/_bridge_build.json")))
            if in_wheel is None:
                sys.exit(f"build.py: {path.name}'s _bridge_build.json records no torch version")
            print(
                f"build.py: {path.name} holds {', '.join(extensions)}, built for torch {in_wheel}", flush=True
            )


def run(step: Step) -> None:
    if step.action is not None:
        step.action()
        return
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in step.env.items())
    print("+ " + (prefix + " " if prefix else "") + shlex.join(step.cmd), flush=True)
    result = subprocess.run(step.cmd, cwd=ROOT, env={**os.environ, **step.env})
    if result.returncode != 0:
        if step.cmd[1:3] == ["-m", "pytest"] and result.returncode == 5:
            sys.exit("build.py: pytest collected no tests")
        if step.cmd[1:4] == ["-m", "pip", "uninstall"]:
            return  # nothing of the other flavours installed
        sys.exit(f"build.py: step '{step.title}' failed (exit {result.returncode})")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        print(json.dumps(describe(args), indent=2))
        return
    check_cuda(args)
    check_training(args)
    if uses_venv(args):
        venv = Path(args.venv)
        if not venv_python(venv).exists():
            run(Step("create the virtual environment", [sys.executable, "-m", "venv", str(venv)]))
            run(
                Step(
                    "upgrade pip", [str(venv_python(venv)), "-m", "pip", "install", "-q", "--upgrade", "pip"]
                )
            )
        argv_rest = sys.argv[1:] if argv is None else argv
        again = [str(venv_python(venv)), str(Path(__file__).resolve()), *argv_rest]
        if os.name == "nt":  # os.execv on Windows returns before the child ends: wait for it
            sys.exit(subprocess.run(again).returncode)
        os.execv(again[0], again)
    for step in plan(args):
        run(step)


if __name__ == "__main__":
    main()

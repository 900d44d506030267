#!/usr/bin/env python3
"""ort-lazy build driver: set up, build, install, wheel, test, run the demo.

A thin driver over the standard build: ``pip install --no-build-isolation .`` compiles the
LazyTensor/TorchScript bridge as a torch C++ extension (``setup.py``). This script adds a
virtual environment with the pinned dependencies and runs the tests or the demo.

Run it with any Python the package supports (``requires-python`` in pyproject.toml). Unless it
already runs inside a virtual environment (or ``--no_venv`` is given), it creates ``.venv``
next to this file, installs the pinned dependencies there and re-runs itself with that
interpreter, so one command does all set-up. ``--venv DIR`` names another environment, which is
used even when this runs inside an active one.

Examples::

    python3 build.py --enable_lazy_tensor --demo     # set up, build, run `ort-lazy demo`
    python3 build.py --enable_lazy_tensor --test     # set up, build, run the test suite
    python3 build.py --enable_lazy_tensor --build_wheel          # wheel into dist/
    python3 build.py --enable_lazy_tensor --test --shards 4 --shard 1   # one CI shard
    python3 build.py --enable_lazy_tensor --test --full --shards 8 --shard 0   # all of op_db + zoo
    python3 build.py --dry_run --use_cuda --enable_lazy_tensor   # print the plan (JSON) only
    python3 build.py --use_openvino --venv .venv-openvino --test --tests tests/opinfo  # a second env

ORT flavours: ``onnxruntime`` (default), ``onnxruntime-gpu`` (``--use_cuda``),
``onnxruntime-training==1.19.2`` (``--enable_training``) and ``onnxruntime-openvino==1.24.1``
(``--use_openvino``). They share the import name ``onnxruntime``, so only one may be installed.
Switching flavour (or, with ``--use_cuda``, replacing a CPU torch) fetches every new package
before anything is removed, and puts the environment back as it was if the switch fails.
``--tests`` runs chosen test files, folders or test ids instead of the whole ``tests/`` folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = ROOT / "src" / "ort_lazy"
DIST = ROOT / "dist"
#: The torch every install path pins (a newer or unpinned torch pulls a multi-GB CUDA wheel).
TORCH_PIN = "torch==2.13.0"
ORT_FLAVOURS = {
    "cpu": "onnxruntime",
    "cuda": "onnxruntime-gpu",
    "training": "onnxruntime-training==1.19.2",
    "openvino": "onnxruntime-openvino==1.24.1",
}
#: ninja: the bridge build (torch's BuildExtension) compiles with it, and recompiles only what changed
BASE_DEPS = ["onnx", "onnxscript", "onnx-ir", "numpy", "pybind11", "setuptools>=77", "wheel", "ninja"]
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
    # Hugging Face's Trainer and accelerate with the onnxrt name (tests/test_trainer.py)
    "accelerate==1.16.0",
    "huggingface-hub",
    "safetensors",
    # timm's own dependencies except torchvision (installed --no-deps below); timm.data imports PIL
    "pillow",
    # the documentation site (mkdocs.yml), built by tests/test_docs.py
    "mkdocs==1.6.1",
    "mkdocs-material==9.8.2",
]
#: test packages installed without their dependencies: timm asks for torchvision, whose PyPI
#: wheel is CUDA-linked and would replace the pinned CPU torch
TEST_DEPS_NO_DEPS = ["timm==1.0.31"]
CONFIGS = ("Release", "RelWithDebInfo", "Debug")
#: CUDA used to pick torch's wheel index when neither --cuda_version nor nvcc says otherwise.
DEFAULT_CUDA = "12.6"
TORCH_WHEEL_INDEX = "https://download.pytorch.org/whl/{tag}"
#: Environment variables setup.py reads (see its docstring).
BRIDGE_ENV = "ORT_LAZY_BUILD_BRIDGE"
CONFIG_ENV = "ORT_LAZY_BUILD_CONFIG"
#: A wheel built by this run, for the tests that check what the build produced.
TEST_WHEEL_ENV = "ORT_LAZY_TEST_WHEEL"
EXTENSION_SUFFIXES = (".so", ".pyd")


@dataclass(frozen=True)
class Wheels:
    """The binary wheels a pinned package publishes on PyPI: for which CPythons and platforms."""

    requirement: str
    pythons: tuple[tuple[int, int], ...]
    #: platform as ``sysconfig.get_platform()`` names it -> the wheel's platform tag
    platforms: dict[str, str]
    #: the oldest glibc the Linux wheels (manylinux_X_Y) run on
    glibc: tuple[int, int] | None = None

    def describe(self) -> str:
        pythons = ", ".join(f"{a}.{b}" for a, b in self.pythons)
        return f"{self.requirement} has wheels for CPython {pythons} on {', '.join(self.platforms.values())}"

    def problem(self, version: tuple[int, int], plat: str, glibc: tuple[int, int] | None) -> str | None:
        """Why no wheel installs on Python ``version`` and platform ``plat``; None if one does."""
        if version not in self.pythons:
            return f"no wheel for Python {version[0]}.{version[1]}"
        if plat not in self.platforms:
            return f"no wheel for platform {plat}"
        if plat.startswith("linux") and self.glibc and (glibc is None or glibc < self.glibc):
            found = "no glibc" if glibc is None else f"glibc {glibc[0]}.{glibc[1]}"
            return f"its Linux wheels need glibc {self.glibc[0]}.{self.glibc[1]} or newer, this system has {found}"
        return None


#: onnxruntime-openvino 1.24.1 on PyPI: cp311-cp313, manylinux_2_28_x86_64 and win_amd64 (no
#: Python 3.10 or 3.14, no macOS, no Linux on Arm). On Windows the OpenVINO runtime is not in the
#: wheel: it needs `pip install openvino` as well (build.py does not add it).
OPENVINO_WHEELS = Wheels(
    ORT_FLAVOURS["openvino"],
    pythons=((3, 11), (3, 12), (3, 13)),
    platforms={"linux-x86_64": "manylinux_2_28_x86_64", "win-amd64": "win_amd64"},
    glibc=(2, 28),
)


# --------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    """The command line (every flag is documented in --help)."""
    p = argparse.ArgumentParser(
        prog="build.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = p.add_argument_group("environment")
    g.add_argument(
        "--venv",
        default=None,
        help="virtual environment to create/use (default: .venv, or the one this runs in; named, it is "
        "used even from inside another one)",
    )
    g.add_argument(
        "--no_venv", action="store_true", help="use the running interpreter as is (CI images, conda envs)"
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
    b = p.add_argument_group("build")
    b.add_argument(
        "--enable_lazy_tensor",
        action="store_true",
        help="build the LazyTensor/TorchScript bridge (the C++ extension in cpp/) into the package; "
        f"without it the install is pure Python ({BRIDGE_ENV}=0)",
    )
    b.add_argument(
        "--use_cuda",
        action="store_true",
        help="install a CUDA torch and onnxruntime-gpu; stops before changing anything when no CUDA "
        "toolkit (nvcc) is found, or no GPU is visible and --test/--demo would run",
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
        help="CUDA version of the torch wheels, e.g. 12.6; must match nvcc",
    )
    b.add_argument(
        "--enable_training",
        action="store_true",
        help="pair the build with onnxruntime-training==1.19.2 instead of onnxruntime",
    )
    b.add_argument(
        "--use_openvino",
        action="store_true",
        help=f"pair the build with {ORT_FLAVOURS['openvino']} (ORT with the OpenVINO execution provider) "
        "instead of onnxruntime; stops before changing anything when it has no wheel for this Python "
        "and platform",
    )
    b.add_argument(
        "--config",
        default="Release",
        choices=CONFIGS,
        help=f"bridge build type: optimisation and debug flags ({CONFIG_ENV}; default: Release)",
    )
    b.add_argument(
        "--build_wheel",
        action="store_true",
        help="build a wheel into dist/ (pip wheel --no-build-isolation): with the bridge it is tagged "
        "for this Python and platform; checked to hold the bridge and its build record",
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
        "--tests",
        nargs="+",
        default=None,
        metavar="PATH",
        help="with --test: run these test files, folders or test ids (tests/test_x.py::test_y; relative "
        "to the source tree) instead of the whole tests/ folder; --workers, --shards and --full apply",
    )
    t.add_argument(
        "--pytest_args",
        default=None,
        metavar="ARGS",
        help="with --test: more pytest arguments, one shell-quoted string appended to the command "
        "(e.g. --pytest_args='-k add --opinfo-samples 1')",
    )
    t.add_argument(
        "--skip_tests", action="store_true", help="never run tests, even with --test (set-up only)"
    )
    t.add_argument(
        "--shards", type=int, default=1, metavar="N", help="split the test suite into N deterministic shards"
    )
    t.add_argument("--shard", type=int, default=0, metavar="I", help="run shard I (0-based) of --shards")
    t.add_argument("--workers", default="2", help="pytest-xdist workers inside the shard (default 2)")
    t.add_argument(
        "--full",
        action="store_true",
        help="with --test: the whole OpInfo parity suite (every sample, dtype and direction) and the "
        "whole model zoo instead of their fast subsets (hours on 2 cores: shard it)",
    )
    t.add_argument("--demo", action="store_true", help="run `ort-lazy demo` after building")
    t.add_argument(
        "--dry_run",
        action="store_true",
        help="print the plan as JSON (checks, commands, torch and ORT flavour, packages a switch "
        "would remove) and exit without changing anything",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the flags (argparse exits with status 2 on a bad combination)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.shards < 1:
        p.error(f"--shards must be >= 1, got {args.shards}")
    if not 0 <= args.shard < args.shards:
        p.error(f"--shard must be in [0, {args.shards}), got {args.shard}")
    if args.full and not args.test:
        p.error("--full selects tests: add --test")
    if args.shards > 1 and not args.test:
        p.error("--shards/--shard select tests: add --test")
    if args.tests is not None and not args.test:
        p.error("--tests selects tests: add --test")
    if args.pytest_args is not None and not args.test:
        p.error("--pytest_args is passed to the tests: add --test")
    if args.pytest_args is not None:
        try:
            shlex.split(args.pytest_args)
        except ValueError as e:
            p.error(f"--pytest_args: {e}")
    chosen = [f for f in ("--use_cuda", "--enable_training", "--use_openvino") if getattr(args, f[2:])]
    if len(chosen) > 1:
        p.error(
            f"{' and '.join(chosen)} pick different ORT packages that share the module `onnxruntime`; "
            "choose one"
        )
    if args.cuda_version is not None:
        if not args.use_cuda:
            p.error("--cuda_version needs --use_cuda")
        if not re.fullmatch(r"\d+\.\d+", args.cuda_version):
            p.error(f"--cuda_version must look like 12.6, got {args.cuda_version!r}")
    if args.cuda_home is not None and not args.use_cuda:
        p.error("--cuda_home needs --use_cuda")
    args.venv_named = args.venv is not None
    if args.venv_named and args.no_venv:
        p.error("--venv and --no_venv exclude each other")
    if args.venv is None:
        args.venv = str(ROOT / ".venv")
    return args


# --------------------------------------------------------------------------- probes


def in_venv() -> bool:
    return sys.prefix != sys.base_prefix


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def uses_venv(args: argparse.Namespace) -> bool:
    """Whether the plan runs in ``args.venv`` (re-executed there) rather than this interpreter:
    not with ``--no_venv``; a ``--venv`` named on the command line unless this already runs in it
    (an activated environment must not take a second one's packages, e.g. the OpenVINO flavour in
    place of ``onnxruntime``); else ``.venv`` unless this runs in some virtual environment."""
    if args.no_venv:
        return False
    if args.venv_named:
        return Path(sys.prefix).resolve() != Path(args.venv).resolve()
    return not in_venv()


def target_python(args: argparse.Namespace) -> str:
    """The interpreter the plan's commands run with."""
    return str(venv_python(Path(args.venv))) if uses_venv(args) else sys.executable


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


_INSTALLED = """
import json, re, sys
from importlib import metadata
dists = {}
for d in metadata.distributions():
    name = d.metadata["Name"]
    if name:
        dists.setdefault(re.sub(r"[-_.]+", "-", name).lower(), d.version)
print(json.dumps({"prefix": sys.prefix, "dists": dists}))
"""

_FILES = """
import json, sys
from importlib import metadata
files = []
for name in json.loads(sys.argv[1]):
    d = metadata.distribution(name)
    files += [str(d.locate_file(f)) for f in (d.files or [])]
print(json.dumps(files))
"""


def environment(py: str) -> dict[str, Any] | None:
    """``{"prefix": ..., "dists": {name: version}}`` of the interpreter ``py``; None if it does not exist."""
    if not Path(py).exists():
        return None
    out = subprocess.run([py, "-c", _INSTALLED], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"build.py: cannot list the packages of {py}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def installed(py: str) -> dict[str, str]:
    """Installed distributions of ``py``: canonical name -> version (empty if ``py`` does not exist)."""
    env = environment(py)
    return env["dists"] if env else {}


def torch_version_of(py: str) -> dict[str, Any] | None:
    """``{"version", "cuda"}`` of the torch ``py`` imports, read from torch/version.py (no import)."""
    if not Path(py).exists():
        return None
    probe = (
        "import importlib.util, json; s = importlib.util.find_spec('torch'); "
        "print(json.dumps(None if s is None or not s.submodule_search_locations "
        "else list(s.submodule_search_locations)[0]))"
    )
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True)
    location = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else None
    if location is None or not (Path(location) / "version.py").is_file():
        return None
    text = (Path(location) / "version.py").read_text()

    def field_of(name: str) -> str | None:
        m = re.search(rf"^{name}\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
        return m.group(1) if m else None

    return {"version": field_of("__version__"), "cuda": field_of("cuda"), "path": location}


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


def host_platform() -> str:
    """This machine as wheel platforms are matched here: ``sysconfig.get_platform()``
    (``linux-x86_64``, ``win-amd64``), macOS without its version (``macosx-arm64``)."""
    plat = sysconfig.get_platform()
    m = re.fullmatch(r"macosx-[\d.]+-(\w+)", plat)
    return f"macosx-{m.group(1)}" if m else plat


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc; None otherwise (musl, not Linux)."""
    lib, version = platform.libc_ver()
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if lib == "glibc" and m else None


def package_version() -> str:
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', (PACKAGE_DIR / "_version.py").read_text(), re.M)
    if not m:
        raise SystemExit("build.py: no __version__ in src/ort_lazy/_version.py")
    return m.group(1)


def supported_pythons() -> tuple[tuple[int, int], tuple[int, int]]:
    """(lowest, first unsupported) Python of pyproject.toml's ``requires-python = ">=3.X,<3.Y"``."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^requires-python\s*=\s*">=(\d+)\.(\d+),\s*<(\d+)\.(\d+)"', text, re.M)
    if not m:
        raise SystemExit('build.py: pyproject.toml needs requires-python = ">=3.X,<3.Y"')
    a, b, c, d = map(int, m.groups())
    return (a, b), (c, d)


# --------------------------------------------------------------------------- decisions


def ort_requirement(args: argparse.Namespace) -> str:
    if args.enable_training:
        return ORT_FLAVOURS["training"]
    if args.use_openvino:
        return ORT_FLAVOURS["openvino"]
    return ORT_FLAVOURS["cuda" if args.use_cuda else "cpu"]


def ort_flavour(args: argparse.Namespace) -> str:
    return re.split(r"[=<>!~ ]", ort_requirement(args))[0]


def other_flavours(args: argparse.Namespace) -> list[str]:
    """The ORT distributions that must not be installed next to the chosen one."""
    names = [re.split(r"[=<>!~ ]", r)[0] for r in ORT_FLAVOURS.values()]
    return [n for n in names if n != ort_flavour(args)]


def cuda_version(args: argparse.Namespace) -> str | None:
    """--cuda_version, else nvcc's, else DEFAULT_CUDA (only with --use_cuda)."""
    if not args.use_cuda:
        return None
    if args.cuda_version:
        return args.cuda_version
    nvcc = find_nvcc(args)
    return (nvcc_version(nvcc) if nvcc else None) or DEFAULT_CUDA


def cuda_tag(args: argparse.Namespace) -> str:
    return "cu" + (cuda_version(args) or DEFAULT_CUDA).replace(".", "")


def torch_index(args: argparse.Namespace) -> str | None:
    if args.torch_index:
        return args.torch_index
    if args.use_cuda:
        return TORCH_WHEEL_INDEX.format(tag=cuda_tag(args))
    return None


def torch_requirement(args: argparse.Namespace) -> str:
    """--torch_spec; with --use_cuda an exact pin gets the CUDA local version (torch==2.13.0+cu126),
    so an installed CPU build of the same version does not satisfy it."""
    if args.use_cuda and re.fullmatch(r"torch==\d+(\.\d+)*", args.torch_spec):
        return args.torch_spec + "+" + cuda_tag(args)
    return args.torch_spec


def index_args(index: str | None) -> list[str]:
    return ["--index-url", index] if index else []


def replaces_torch(args: argparse.Namespace, py: str) -> bool:
    """--use_cuda and an installed torch that is not that CUDA build: installing replaces it."""
    if not args.use_cuda:
        return False
    torch = torch_version_of(py)
    return torch is not None and not (torch["version"] or "").endswith("+" + cuda_tag(args))


def wheel_tags() -> tuple[str, str, str]:
    """(python, abi, platform) tags of a wheel holding a CPython extension built here."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return py, py, re.sub(r"[-.]", "_", sysconfig.get_platform())


def wheel_path(args: argparse.Namespace) -> Path:
    name = f"ort_lazy-{package_version()}"
    if args.enable_lazy_tensor:
        return DIST / (name + "-{}-{}-{}.whl".format(*wheel_tags()))
    return DIST / f"{name}-py3-none-any.whl"


# --------------------------------------------------------------------------- switching packages


def run_command(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` from the source tree, echoed; return its exit status."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    print("+ " + (prefix + " " if prefix else "") + shlex.join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}).returncode


@dataclass
class Stash:
    """Copies of installed files (hard links where possible), to put back after a failed switch."""

    root: Path
    files: list[tuple[Path, Path]] = field(default_factory=list)  # (copy, original)

    @classmethod
    def save(cls, root: Path, paths: Iterable[str]) -> Stash:
        root.mkdir(parents=True, exist_ok=True)
        stash = cls(root)
        for i, original in enumerate(sorted({os.path.abspath(p) for p in paths})):
            src = Path(original)
            if not (src.is_file() or src.is_symlink()):
                continue  # listed in RECORD but absent (e.g. a .pyc never written)
            copy = root / str(i)
            try:
                os.link(src, copy, follow_symlinks=False)
            except OSError:
                shutil.copy2(src, copy, follow_symlinks=False)
            stash.files.append((copy, src))
        return stash

    def restore(self) -> None:
        for copy, original in self.files:
            original.parent.mkdir(parents=True, exist_ok=True)
            if original.is_symlink() or original.exists():
                original.unlink()
            os.replace(copy, original)
        self.files.clear()

    def drop(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Switch:
    """Replace installed packages safely: fetch the new ones first, restore the old ones on failure.

    ``remove`` are installed distributions to uninstall (the other ORT flavours); ``fetch`` are
    ``(requirements, pip index arguments)`` groups to install. Steps: download every new wheel
    (an unreachable index or a missing wheel stops here, before any change); ask pip (offline,
    ``--dry-run``) which installed packages the install would replace; keep a copy of those and
    of ``remove``; uninstall ``remove``; install offline from the downloaded wheels. If that
    fails (or is interrupted), whatever it added is uninstalled and the copies are put back.
    """

    py: str
    remove: list[str]
    fetch: list[tuple[list[str], list[str]]]
    workdir: Path
    runner: Callable[[list[str]], int] = run_command

    def requirements(self) -> list[str]:
        return [r for reqs, _ in self.fetch for r in reqs]

    def describe(self) -> dict[str, Any]:
        return {
            "remove": self.remove,
            "install": self.requirements(),
            "fetch": [shlex.join(self._download(reqs, index)) for reqs, index in self.fetch],
        }

    def _pip(self, *args: str) -> list[str]:
        return [self.py, "-m", "pip", *args]

    def _download(self, reqs: list[str], index: list[str]) -> list[str]:
        return self._pip("download", "-q", "-d", str(self.workdir / "wheels"), *index, *reqs)

    def apply(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        wheels = str(self.workdir / "wheels")
        try:
            for reqs, index in self.fetch:
                if self.runner(self._download(reqs, index)) != 0:
                    sys.exit(
                        f"build.py: could not fetch {', '.join(reqs)} (index unreachable or no matching "
                        "wheel); nothing was changed"
                    )
            report = self.workdir / "report.json"
            offline = ["--no-index", "--find-links", wheels]
            if (
                self.runner(
                    self._pip(
                        "install", "-q", "--dry-run", *offline, "--report", str(report), *self.requirements()
                    )
                )
                != 0
            ):
                sys.exit("build.py: the fetched packages do not install together; nothing was changed")
            before = installed(self.py)
            replaced = []
            for item in json.loads(report.read_text()).get("install", []):
                name = canonical(item["metadata"]["name"])
                if name in before and before[name] != item["metadata"]["version"]:
                    replaced.append(name)
            keep = [n for n in self.remove if n in before] + replaced
            stash = Stash.save(self.workdir / "stash", self._files(keep))
            ok = False
            try:
                ok = (
                    not self.remove or self.runner(self._pip("uninstall", "-y", "-q", *self.remove)) == 0
                ) and (self.runner(self._pip("install", "-q", *offline, *self.requirements())) == 0)
            finally:
                if not ok:
                    self._restore(before, stash)
            if not ok:
                sys.exit(
                    f"build.py: installing {', '.join(self.requirements())} failed; the environment was "
                    f"restored ({', '.join(keep) or 'nothing'} put back)"
                )
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _files(self, names: list[str]) -> list[str]:
        if not names:
            return []
        out = subprocess.run([self.py, "-c", _FILES, json.dumps(names)], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"build.py: cannot list the files of {', '.join(names)}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def _restore(self, before: dict[str, str], stash: Stash) -> None:
        """Uninstall what the failed switch added or replaced, then put the saved files back."""
        after = installed(self.py)
        changed = sorted(n for n, v in after.items() if before.get(n) != v)
        if changed:
            self.runner(self._pip("uninstall", "-y", "-q", *changed))
        stash.restore()
        left = {n: v for n, v in installed(self.py).items() if before.get(n) != v}
        gone = sorted(set(before) - set(installed(self.py)))
        if left or gone:
            print(f"build.py: after restoring, differs from before: added {left}, missing {gone}", flush=True)


def switch_for(args: argparse.Namespace, py: str) -> Switch | None:
    """The package switch this run needs, or None: another ORT flavour installed, or (--use_cuda)
    an installed torch that a CUDA build replaces."""
    if args.skip_deps:
        return None
    have = installed(py)
    remove = [n for n in other_flavours(args) if n in have]
    fetch: list[tuple[list[str], list[str]]] = []
    if replaces_torch(args, py):
        fetch.append(([torch_requirement(args)], index_args(torch_index(args))))
    if not remove and not fetch:
        return None
    fetch.append(([ort_requirement(args)], []))
    env = environment(py)
    prefix = Path(env["prefix"]) if env else Path(args.venv)
    return Switch(py, remove, fetch, prefix / ".ort-lazy-switch")


# --------------------------------------------------------------------------- the plan


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


def build_env(args: argparse.Namespace) -> dict[str, str]:
    """What setup.py reads: the bridge on or off, and its build type."""
    return {BRIDGE_ENV: "1" if args.enable_lazy_tensor else "0", CONFIG_ENV: args.config}


def plan(args: argparse.Namespace, py: str | None = None) -> list[Step]:
    """Everything this invocation does after the checks, in order (what --dry_run prints)."""
    py = py or target_python(args)
    pip = [py, "-m", "pip"]
    env = build_env(args)
    steps: list[Step] = []
    if uses_venv(args) and not venv_python(Path(args.venv)).exists():
        steps.append(Step("create the virtual environment", [sys.executable, "-m", "venv", args.venv]))
        steps.append(Step("upgrade pip", [*pip, "install", "-q", "--upgrade", "pip"]))
    if not args.skip_deps:
        switch = switch_for(args, py)
        if switch is not None:
            steps.append(
                Step(
                    "switch packages (fetched first, restored on failure)",
                    ["build.py:switch", *switch.remove, "->", *switch.requirements()],
                    action=switch.apply,
                )
            )
        steps.append(
            Step(
                "install torch",
                [*pip, "install", "-q", torch_requirement(args), *index_args(torch_index(args))],
            )
        )
        deps = [ort_requirement(args), *BASE_DEPS, *(TEST_DEPS if args.test else [])]
        steps.append(Step("install dependencies", [*pip, "install", "-q", *deps]))
        if args.test:
            steps.append(
                Step(
                    "install test models (without torchvision)",
                    [*pip, "install", "-q", "--no-deps", *TEST_DEPS_NO_DEPS],
                )
            )
    if args.use_cuda:
        steps.append(
            Step(
                "check torch is a CUDA build",
                ["build.py:check_cuda_torch"],
                action=lambda: check_cuda_torch(args, py),
            )
        )
    install = args.install or args.test or args.demo
    run_env: dict[str, str] = dict(env)
    if args.build_wheel:
        wheel = wheel_path(args)
        steps.append(
            Step(
                "clear stale wheels",
                ["build.py:clear", str(DIST / f"ort_lazy-{package_version()}-*.whl")],
                action=clear_wheels,
            )
        )
        steps.append(
            Step(
                "build the wheel",
                [*pip, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(DIST), str(ROOT)],
                env,
            )
        )
        steps.append(
            Step(
                "check the wheel",
                ["build.py:check_wheel", str(wheel)],
                action=lambda: check_wheel(wheel, args.enable_lazy_tensor),
            )
        )
        run_env[TEST_WHEEL_ENV] = str(wheel)
        if install:
            steps.append(
                Step(
                    "install the wheel", [*pip, "install", "-q", "--no-deps", "--force-reinstall", str(wheel)]
                )
            )
    elif install:
        if not args.enable_lazy_tensor:
            steps.append(
                Step(
                    "remove a bridge left in src/ by an earlier build",
                    ["build.py:remove_inplace_bridge", str(PACKAGE_DIR)],
                    action=remove_inplace_bridge,
                )
            )
        steps.append(
            Step(
                "install ort-lazy (editable)",
                [*pip, "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(ROOT)],
                env,
            )
        )
    if args.test and not args.skip_tests:
        steps.append(Step("run the tests", test_command(args, py), run_env))
    if args.demo:
        steps.append(Step("run the demo", [py, "-m", "ort_lazy.cli", "demo"], run_env))
    return steps


def test_paths(args: argparse.Namespace) -> list[str]:
    """What pytest collects: ``--tests`` (relative ones taken from the source tree, ``::test``
    ids kept), else the whole tests/ folder."""
    if not args.tests:
        return [str(ROOT / "tests")]
    out = []
    for target in args.tests:
        path, sep, node = target.partition("::")
        out.append(str(ROOT / path) + sep + node)
    return out


def test_command(args: argparse.Namespace, py: str) -> list[str]:
    cmd = [py, "-m", "pytest", "-q", "-n", str(args.workers), *test_paths(args)]
    if args.full:
        cmd += ["--opinfo=full", "--full-tier", "--max-worker-restart", "100"]
    if args.shards > 1:
        cmd += ["--shards", str(args.shards), "--shard", str(args.shard)]
    if args.pytest_args:
        cmd += shlex.split(args.pytest_args)
    return cmd


def describe(args: argparse.Namespace) -> dict[str, Any]:
    """The plan as data: what --dry_run prints."""
    py = target_python(args)
    nvcc = find_nvcc(args) if args.use_cuda else None
    switch = switch_for(args, py)
    return {
        "python": py,
        "venv": args.venv if uses_venv(args) else None,
        "checks": checks(args),
        "torch": {
            "found": torch_version_of(py),
            "install": None if args.skip_deps else torch_requirement(args),
            "index": None if args.skip_deps else torch_index(args),
        },
        "onnxruntime": {"flavour": ort_flavour(args), "requirement": ort_requirement(args)},
        "switch": switch.describe() if switch else None,
        "bridge": {"enabled": args.enable_lazy_tensor, "config": args.config, "env": build_env(args)},
        "cuda": None
        if not args.use_cuda
        else {
            "version": cuda_version(args),
            "nvcc": str(nvcc) if nvcc else None,
            "gpu_visible": gpu_visible(),
        },
        "wheel": str(wheel_path(args)) if args.build_wheel else None,
        "openvino": openvino_wheels(args),
        "tests": None
        if not args.test or args.skip_tests
        else {
            "shards": args.shards,
            "shard": args.shard,
            "workers": args.workers,
            "paths": test_paths(args),
            "pytest_args": shlex.split(args.pytest_args) if args.pytest_args else [],
        },
        "steps": [s.describe() for s in plan(args, py)],
    }


# --------------------------------------------------------------------------- checks and actions


def openvino_wheels(args: argparse.Namespace) -> dict[str, Any] | None:
    """With --use_openvino: where its wheels exist, this machine, and why none installs here
    (``problem``; None when one does). What --dry_run shows of the wheel check."""
    if not args.use_openvino:
        return None
    version = (sys.version_info.major, sys.version_info.minor)
    plat, glibc = host_platform(), glibc_version()
    return {
        "requirement": OPENVINO_WHEELS.requirement,
        "pythons": [f"{a}.{b}" for a, b in OPENVINO_WHEELS.pythons],
        "platforms": list(OPENVINO_WHEELS.platforms.values()),
        "here": {
            "python": f"{version[0]}.{version[1]}",
            "platform": plat,
            "glibc": None if glibc is None else f"{glibc[0]}.{glibc[1]}",
        },
        "problem": OPENVINO_WHEELS.problem(version, plat, glibc),
    }


def missing_tests(args: argparse.Namespace) -> list[str]:
    """The --tests entries whose file or folder does not exist."""
    targets = args.tests or []
    return [t for t, path in zip(targets, test_paths(args)) if not Path(path.partition("::")[0]).exists()]


def checks(args: argparse.Namespace) -> list[str]:
    """What is checked before anything is changed (the --dry_run view of preflight())."""
    out = ["python version"]
    if args.tests and args.test and not args.skip_tests:
        out.append("--tests paths exist")
    if args.enable_training:
        out.append("onnxruntime-training wheels for this python")
    if args.use_openvino:
        out += [
            f"{OPENVINO_WHEELS.requirement} wheels for this python and platform",
            "new packages fetched before a switch removes anything",
        ]
    if args.use_cuda:
        out += ["nvcc found, its CUDA version matches --cuda_version"]
        if (args.test and not args.skip_tests) or args.demo:
            out.append("GPU visible")
        out.append("new packages fetched before a switch removes anything")
    return out


def preflight(args: argparse.Namespace, version: tuple[int, int] | None = None) -> None:
    """Stop, before changing anything, when this run cannot work here (``version``: the Python
    the environment gets, default this one)."""
    version = version or (sys.version_info.major, sys.version_info.minor)
    lo, hi = supported_pythons()
    if not lo <= version < hi:
        sys.exit(
            f"build.py: ort-lazy supports Python {lo[0]}.{lo[1]} to {hi[0]}.{hi[1] - 1} (torch's wheels); "
            f"this is {version[0]}.{version[1]}"
        )
    if args.test and not args.skip_tests and missing_tests(args):
        sys.exit(
            f"build.py: --tests: no such test file or folder: {', '.join(missing_tests(args))} "
            f"(relative paths are taken from {ROOT})"
        )
    if args.enable_training and not args.skip_deps and version >= (3, 13):
        sys.exit(
            f"build.py: --enable_training installs {ORT_FLAVOURS['training']}, which has no wheels for "
            f"Python {version[0]}.{version[1]}; use Python 3.10-3.12"
        )
    if args.use_openvino and not args.skip_deps:
        plat = host_platform()
        problem = OPENVINO_WHEELS.problem(version, plat, glibc_version())
        if problem:
            advice = (
                " Run build.py with one of those Pythons, or keep onnxruntime and add the OpenVINO "
                "plugin, whose wheels take any Python 3: pip install onnxruntime-ep-openvino, then "
                "ep_libraries='onnxruntime_ep_openvino'."
                if plat in OPENVINO_WHEELS.platforms and problem.startswith("no wheel for Python")
                else ""
            )
            sys.exit(
                f"build.py: --use_openvino installs {OPENVINO_WHEELS.requirement}: {problem}. "
                f"{OPENVINO_WHEELS.describe()}; nothing was changed.{advice}"
            )
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


def check_cuda_torch(args: argparse.Namespace, py: str) -> None:
    """--use_cuda pairs onnxruntime-gpu with a CUDA torch: stop before building if it is not one."""
    torch = torch_version_of(py)
    if torch is None:
        sys.exit("build.py: --use_cuda: no torch found to build against")
    if not torch["cuda"]:
        sys.exit(
            f"build.py: --use_cuda needs a CUDA build of torch, but torch {torch['version']} at {torch['path']} "
            f"is a CPU build (install {torch_requirement(args)} from {torch_index(args)})"
        )
    want = cuda_version(args)
    if want and torch["cuda"].split(".")[0] != want.split(".")[0]:
        sys.exit(
            f"build.py: torch {torch['version']} was built with CUDA {torch['cuda']}, the toolkit is CUDA {want}"
        )


def clear_wheels() -> None:
    """An old wheel of this version in dist/ would be taken for the new one."""
    for old in DIST.glob(f"ort_lazy-{package_version()}-*.whl"):
        old.unlink()


def remove_inplace_bridge() -> None:
    """An editable install without the bridge must not load one an earlier build left in src/."""
    for old in PACKAGE_DIR.glob("_bridge*"):
        if old.suffix in EXTENSION_SUFFIXES or old.name == "_bridge_build.json":
            old.unlink()


def check_wheel(path: Path, with_bridge: bool) -> None:
    """The wheel exists, is tagged as what it holds, and with the bridge holds its build record."""
    if not path.is_file():
        built = sorted(p.name for p in DIST.glob("ort_lazy-*.whl"))
        sys.exit(f"build.py: expected wheel {path.name} was not built (dist/ holds {built})")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        extensions = [n for n in names if n.startswith("ort_lazy/_bridge") and n.endswith(EXTENSION_SUFFIXES)]
        if with_bridge and not extensions:
            sys.exit(f"build.py: {path.name} holds no compiled bridge")
        if extensions and path.name.endswith("-py3-none-any.whl"):
            sys.exit(f"build.py: {path.name} holds {', '.join(extensions)} under a pure-Python tag")
        if not with_bridge and extensions:
            sys.exit(f"build.py: {path.name} holds a bridge ({', '.join(extensions)}) it was not asked to")
        if extensions:
            if "ort_lazy/_bridge_build.json" not in names:
                sys.exit(f"build.py: {path.name} holds the bridge but not ort_lazy/_bridge_build.json")
            record = json.loads(zf.read("ort_lazy/_bridge_build.json"))
            if not record.get("torch_version"):
                sys.exit(f"build.py: {path.name}'s _bridge_build.json records no torch version")
            print(
                f"build.py: {path.name} holds {', '.join(extensions)}, built for torch {record['torch_version']}"
            )


def run(step: Step) -> None:
    if step.action is not None:
        step.action()
        return
    code = run_command(step.cmd, step.env)
    if code != 0:
        if step.cmd[1:3] == ["-m", "pytest"] and code == 5:
            sys.exit("build.py: pytest collected no tests")
        sys.exit(f"build.py: step '{step.title}' failed (exit {code})")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        print(json.dumps(describe(args), indent=2))
        return
    preflight(args)
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

#!/usr/bin/env python3
"""ort-lazy build driver: set up, build the bridge, install, test, run the demo.

Run it with any Python >= 3.10. Unless it already runs inside a virtual environment (or
``--no_venv`` is given), it creates ``.venv`` next to this file, installs the pinned
dependencies there and re-runs itself with that interpreter, so one command does all set-up.

Examples::

    python3 build.py --enable_lazy_tensor --demo     # set up, build, run `ort-lazy demo`
    python3 build.py --enable_lazy_tensor --test     # set up, build, run the test suite
    python3 build.py --dry_run --use_cuda            # print the plan only
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
#: The torch every install path pins (a newer or unpinned torch pulls a multi-GB CUDA wheel).
TORCH_PIN = "torch==2.13.0"
ORT_FLAVOURS = {"cpu": "onnxruntime", "cuda": "onnxruntime-gpu", "training": "onnxruntime-training==1.19.2"}
BASE_DEPS = ["onnx", "onnxscript", "onnx-ir", "numpy", "pybind11", "setuptools", "wheel"]
TEST_DEPS = ["pytest", "pytest-xdist", "ruff"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("environment")
    g.add_argument("--venv", default=str(ROOT / ".venv"), help="virtual environment to create/use (default: .venv)")
    g.add_argument("--no_venv", action="store_true", help="use the running interpreter as is")
    g.add_argument("--skip_deps", action="store_true", help="do not pip-install dependencies")
    g.add_argument("--torch_spec", default=TORCH_PIN, help=f"pip requirement for torch (default: {TORCH_PIN})")
    g.add_argument("--torch_dir", default=None, help="compile the bridge against the torch installed at PATH")
    b = p.add_argument_group("build")
    b.add_argument("--enable_lazy_tensor", action="store_true", help="build the pybind11 LazyTensor/TorchScript bridge (cpp/)")
    b.add_argument("--use_cuda", action="store_true", help="build against a CUDA torch and pair with onnxruntime-gpu")
    b.add_argument("--cuda_home", default=os.environ.get("CUDA_HOME"), help="CUDA toolkit root (with --use_cuda)")
    b.add_argument("--cuda_version", default=None, help="CUDA version, e.g. 12.6 (with --use_cuda)")
    b.add_argument("--enable_training", action="store_true", help="pair the build with onnxruntime-training 1.19.2")
    b.add_argument("--enable_nvtx_profile", action="store_true", help="NVTX ranges around export, session creation and runs (CUDA)")
    b.add_argument("--config", default="Release", choices=["Debug", "Release", "RelWithDebInfo"], help="bridge build type")
    b.add_argument("--parallel", type=int, default=os.cpu_count() or 1, help="parallel compile jobs")
    b.add_argument("--build_wheel", action="store_true", help="build a wheel into dist/")
    b.add_argument("--install", action="store_true", help="install the package (editable) into the environment (default when testing or demoing)")
    t = p.add_argument_group("run")
    t.add_argument("--test", action="store_true", help="run the test suite (pytest -n 2)")
    t.add_argument("--skip_tests", action="store_true", help="never run tests, even with --test")
    t.add_argument("--shards", type=int, default=1, help="split the test suite into N shards")
    t.add_argument("--shard", type=int, default=0, help="run shard I (0-based) of --shards")
    t.add_argument("--workers", default="2", help="pytest-xdist workers per shard (default 2)")
    t.add_argument("--demo", action="store_true", help="run `ort-lazy demo` after building")
    t.add_argument("--dry_run", action="store_true", help="print the plan without doing it")
    args = p.parse_args(argv)
    if not 0 <= args.shard < args.shards:
        p.error(f"--shard must be in [0, {args.shards}), got {args.shard}")
    return args


def in_venv() -> bool:
    return sys.prefix != sys.base_prefix


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ort_requirement(args: argparse.Namespace) -> str:
    if args.enable_training:
        return ORT_FLAVOURS["training"]
    return ORT_FLAVOURS["cuda" if args.use_cuda else "cpu"]


def plan(args: argparse.Namespace) -> list[list[str]]:
    """The commands this invocation runs, in order (what --dry_run prints)."""
    py = sys.executable
    steps: list[list[str]] = []
    if not args.skip_deps:
        deps = [args.torch_spec, ort_requirement(args), *BASE_DEPS]
        if args.test:
            deps += TEST_DEPS
        steps.append([py, "-m", "pip", "install", "-q", *deps])
    if args.enable_lazy_tensor:
        cmd = [py, str(ROOT / "cpp" / "build_bridge.py"), "--config", args.config, "--parallel", str(args.parallel)]
        if args.torch_dir:
            cmd += ["--torch_dir", args.torch_dir]
        if args.use_cuda:
            cmd += ["--use_cuda"]
        steps.append(cmd)
    if args.install or args.test or args.demo:
        steps.append([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(ROOT)])
    if args.build_wheel:
        steps.append([py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(ROOT / "dist"), str(ROOT)])
    if args.test and not args.skip_tests:
        steps.append(test_command(args, py))
    if args.demo:
        steps.append([py, "-m", "ort_lazy.cli", "demo"])
    return steps


def test_command(args: argparse.Namespace, py: str) -> list[str]:
    cmd = [py, "-m", "pytest", "-q", "-n", str(args.workers), str(ROOT / "tests")]
    if args.shards > 1:
        cmd += ["--shards", str(args.shards), "--shard", str(args.shard)]
    return cmd


def check_cuda(args: argparse.Namespace) -> None:
    """Stop before building when --use_cuda cannot work here."""
    if not args.use_cuda:
        return
    home = args.cuda_home or "/usr/local/cuda"
    nvcc = Path(home) / "bin" / ("nvcc.exe" if os.name == "nt" else "nvcc")
    if not nvcc.exists():
        sys.exit(f"build.py: --use_cuda needs the CUDA toolkit: no nvcc at {nvcc} (set --cuda_home or CUDA_HOME)")


def run(cmd: list[str]) -> None:
    print("+ " + shlex.join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=ROOT)
    if result.returncode != 0:
        if cmd[1:3] == ["-m", "pytest"] and result.returncode == 5:
            sys.exit("build.py: pytest collected no tests")
        sys.exit(result.returncode)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.dry_run:
        check_cuda(args)
    if not args.no_venv and not in_venv() and not args.dry_run:
        venv = Path(args.venv)
        if not venv_python(venv).exists():
            run([sys.executable, "-m", "venv", str(venv)])
            run([str(venv_python(venv)), "-m", "pip", "install", "-q", "--upgrade", "pip"])
        os.execv(str(venv_python(venv)), [str(venv_python(venv)), str(Path(__file__).resolve()), *sys.argv[1:]])
    steps = plan(args)
    if args.dry_run:
        info = {
            "python": sys.executable,
            "torch": args.torch_spec if not args.torch_dir else f"from {args.torch_dir}",
            "onnxruntime": ort_requirement(args),
            "bridge": args.enable_lazy_tensor,
            "config": args.config,
            "cuda": args.use_cuda,
        }
        print(json.dumps(info, indent=2))
        for cmd in steps:
            print(shlex.join(cmd))
        return
    for cmd in steps:
        run(cmd)


if __name__ == "__main__":
    main()

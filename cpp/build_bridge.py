#!/usr/bin/env python3
"""Build the ort-lazy bridge (``ort_lazy._bridge``) against an installed torch.

The bridge is a pybind11 extension compiled with ``torch.utils.cpp_extension`` (ninja, no
CMake, no PyTorch source build). The shared library lands in ``src/ort_lazy/`` next to
``_bridge_build.json``, which records the torch it was built against: loading it under
another torch raises a clear error instead of crashing.

Usage::

    python cpp/build_bridge.py --config Release --parallel 2
    python cpp/build_bridge.py --torch_dir /opt/torch-nightly/site-packages
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "src" / "ort_lazy"
SOURCES = [HERE / "bridge.cpp"]
MODULE = "_bridge"
BUILD_INFO = "_bridge_build.json"
CONFIGS = {
    "Release": ["-O3", "-DNDEBUG"],
    "RelWithDebInfo": ["-O2", "-g", "-DNDEBUG"],
    "Debug": ["-O0", "-g"],
}

__all__ = ["build", "main", "resolve_torch_dir", "BUILD_INFO", "CONFIGS"]


def resolve_torch_dir(path: str | os.PathLike[str]) -> Path:
    """The directory to put first on ``sys.path`` so ``import torch`` finds the torch at ``path``.

    ``path`` may be that directory (e.g. a ``site-packages``) or the ``torch`` package itself.
    """
    p = Path(path).expanduser().resolve()
    if (p / "torch" / "__init__.py").is_file():
        return p
    if p.name == "torch" and (p / "__init__.py").is_file():
        return p.parent
    raise FileNotFoundError(f"--torch_dir {path}: no torch package found there (expected {p}/torch/__init__.py)")


def build(
    config: str = "Release",
    parallel: int | None = None,
    torch_dir: str | os.PathLike[str] | None = None,
    use_cuda: bool = False,
    out_dir: str | os.PathLike[str] = DEFAULT_OUT,
    verbose: bool = False,
) -> Path:
    """Compile ``ort_lazy._bridge`` into ``out_dir`` and return the path of the library.

    Args:
        config: ``Release``, ``RelWithDebInfo`` or ``Debug``.
        parallel: compile jobs (``MAX_JOBS`` for ninja); default: all cores.
        torch_dir: compile against the torch installed there instead of the running one
            (the build then runs in a subprocess with that directory first on ``sys.path``).
        use_cuda: build against a CUDA torch (checks that the torch has CUDA).
        out_dir: where the library and ``_bridge_build.json`` go (default ``src/ort_lazy``).
        verbose: show the compiler command lines.

    Raises:
        ValueError: unknown ``config``.
        RuntimeError: the compiler failed, or ``use_cuda`` with a CPU-only torch.
    """
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {', '.join(CONFIGS)}, got {config!r}")
    out = Path(out_dir).resolve()
    if torch_dir is not None:
        site = resolve_torch_dir(torch_dir)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--config", config, "--out_dir", str(out)]
        if parallel:
            cmd += ["--parallel", str(parallel)]
        if use_cuda:
            cmd.append("--use_cuda")
        if verbose:
            cmd.append("--verbose")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
        result = subprocess.run(cmd, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"bridge build against torch in {site} failed (exit {result.returncode})")
        return _library_in(out)
    return _build_here(config, parallel, use_cuda, out, verbose)


def _library_in(out: Path) -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return out / (MODULE + suffix)


def _build_here(config: str, parallel: int | None, use_cuda: bool, out: Path, verbose: bool) -> Path:
    import torch
    from torch.utils import cpp_extension

    if use_cuda and not torch.version.cuda:
        raise RuntimeError(f"--use_cuda: torch {torch.__version__} at {Path(torch.__file__).parent} has no CUDA")
    os.environ["MAX_JOBS"] = str(parallel or os.cpu_count() or 1)
    tag = f"{torch.__version__}-{config}".replace("+", "_")
    build_dir = HERE / "build" / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    cflags = ["-std=c++17", *CONFIGS[config], f"-DORT_LAZY_TORCH_VERSION={torch.__version__}"]
    start = time.perf_counter()
    # Everything the bridge calls lives in libtorch_cpu / libtorch_python; the CUDA flavour
    # only changes which torch it links against (ORT owns the CUDA work).
    lib = cpp_extension.load(
        name=MODULE,
        sources=[str(s) for s in SOURCES],
        extra_cflags=cflags,
        build_directory=str(build_dir),
        verbose=verbose,
        is_python_module=False,
        is_standalone=False,
    )
    del lib
    built = next(p for p in build_dir.iterdir() if p.name.startswith(MODULE) and p.suffix in (".so", ".pyd"))
    out.mkdir(parents=True, exist_ok=True)
    target = _library_in(out)
    for old in out.glob(MODULE + ".*"):
        if old.suffix in (".so", ".pyd"):
            old.unlink()
    tmp = target.with_name(target.name + ".tmp")
    shutil.copy2(built, tmp)
    os.replace(tmp, target)
    info = {
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_path": str(Path(torch.__file__).parent),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "config": config,
        "cuda": bool(use_cuda),
        "python": sys.version.split()[0],
        "library": target.name,
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"built {target} against torch {torch.__version__} ({config}) in {time.perf_counter() - start:.1f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="Release", choices=list(CONFIGS), help="build type (default Release)")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1, help="parallel compile jobs")
    p.add_argument("--torch_dir", default=None, help="compile against the torch installed at PATH")
    p.add_argument("--use_cuda", action="store_true", help="build against a CUDA torch")
    p.add_argument("--out_dir", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--verbose", action="store_true", help="show compiler command lines")
    args = p.parse_args(argv)
    try:
        build(args.config, args.parallel, args.torch_dir, args.use_cuda, args.out_dir, args.verbose)
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"build_bridge.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build ort-lazy: the Python package and, unless switched off, the LazyTensor/TorchScript bridge.

The bridge (``ort_lazy._bridge``, from ``cpp/bridge.cpp``) is a
``torch.utils.cpp_extension.CppExtension`` built by setuptools' ``build_ext`` (torch's
``BuildExtension``). It is compiled against the torch that runs this build, so install with
that torch already in place and without build isolation::

    pip install torch==2.13.0
    pip install --no-build-isolation .

A wheel holding the bridge is tagged for this Python and platform; without it the wheel is pure
(``py3-none-any``). Environment variables read here:

``ORT_LAZY_BUILD_BRIDGE``
    ``1`` (default) builds the bridge; ``0`` installs pure Python (no compiler needed; everything
    but ``ort_lazy.lazy`` / ``ort_lazy.jit`` works, and those raise an error saying how to build).
``ORT_LAZY_BUILD_CONFIG``
    ``Release`` (default), ``RelWithDebInfo`` or ``Debug``: the optimisation flags.

Next to the library the build writes ``ort_lazy/_bridge_build.json``: the torch version the
bridge was compiled against (also compiled in, as ``ORT_LAZY_TORCH_VERSION``), the build
configuration and the compiler flags. ``ort_lazy.runtime.bridge`` checks it before loading.

Every build of this tree (editable install, wheel, ``setup.py build``) compiles into
``build/temp.<platform>-<python>`` and records there too which torch and flags its objects are
of: a later build with the same torch and flags reuses them (ninja recompiles only what changed,
e.g. ``pip wheel`` after the editable install links in a second), one with another torch or
other flags starts from an empty directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import setup

ROOT = Path(__file__).resolve().parent
BRIDGE = "ort_lazy._bridge"
RECORD = "_bridge_build.json"
BRIDGE_ENV = "ORT_LAZY_BUILD_BRIDGE"
CONFIG_ENV = "ORT_LAZY_BUILD_CONFIG"
#: compiler flags per build configuration (GCC/Clang spelling; MSVC in MSVC_CONFIGS)
CONFIGS = {
    "Release": ["-O3", "-DNDEBUG"],
    "RelWithDebInfo": ["-O2", "-g", "-DNDEBUG"],
    "Debug": ["-O0", "-g"],
}
MSVC_CONFIGS = {
    "Release": ["/O2", "/DNDEBUG"],
    "RelWithDebInfo": ["/O2", "/Zi", "/DNDEBUG"],
    "Debug": ["/Od", "/Zi"],
}


def bridge_enabled() -> bool:
    """Whether ``ORT_LAZY_BUILD_BRIDGE`` asks for the bridge (default: yes)."""
    value = os.environ.get(BRIDGE_ENV, "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"setup.py: {BRIDGE_ENV} must be 1 or 0, got {value!r}")


def build_config() -> str:
    """The build configuration ``ORT_LAZY_BUILD_CONFIG`` names (default ``Release``)."""
    config = os.environ.get(CONFIG_ENV, "Release")
    if config not in CONFIGS:
        raise SystemExit(f"setup.py: {CONFIG_ENV} must be one of {', '.join(CONFIGS)}, got {config!r}")
    return config


def _cxx_standard_in(text: str, pattern: str) -> int | None:
    """The two-digit C++ standard ``pattern`` captures in ``text`` (``201703`` -> 17), else None."""
    m = re.search(pattern, text)
    if not m:
        return None
    value = m.group(1)
    return int(value[2:4]) if len(value) == 6 else int(value)


def torch_cxx_standard(torch_dir: Path | None = None) -> int:
    """The C++ standard the bridge is compiled with, taken from the installed torch.

    torch builds itself (and ``torch.utils.cpp_extension`` its extensions) with the standard
    ``TorchConfig.cmake`` declares (``CXX_STANDARD 20`` on torch 2.13 and 2.14); its headers
    refuse anything older than the one ``torch/all.h`` checks ``__cplusplus`` against (C++17 on
    2.13, C++20 on 2.14). The larger of the two; C++17 when neither file can be read (no torch
    has ever accepted less).
    """
    if torch_dir is None:
        import torch

        torch_dir = Path(torch.__file__).resolve().parent
    found = [17]
    for relative, pattern in (
        ("share/cmake/Torch/TorchConfig.cmake", r"CXX_STANDARD\s+(\d+)"),
        ("include/torch/csrc/api/include/torch/all.h", r"__cplusplus\s*<\s*(\d{6})L"),
    ):
        try:
            standard = _cxx_standard_in((torch_dir / relative).read_text(errors="replace"), pattern)
        except OSError:
            continue
        if standard is not None:
            found.append(standard)
    return max(found)


def compiler_flags(config: str, torch_version: str, standard: int | None = None) -> list[str]:
    """The flags the bridge is compiled with: language level (``standard``, default the
    installed torch's: :func:`torch_cxx_standard`), optimisation, torch version."""
    std = f"c++{standard or torch_cxx_standard()}"
    if sys.platform == "win32":
        return [f"/std:{std}", *MSVC_CONFIGS[config], f"/DORT_LAZY_TORCH_VERSION={torch_version}"]
    # Unquoted: bridge.cpp stringizes the macro (quotes would not survive the ninja file).
    return [f"-std={std}", *CONFIGS[config], f"-DORT_LAZY_TORCH_VERSION={torch_version}", *openmp_flags()]


def openmp_flags() -> list[str]:
    """``-fopenmp`` on Linux when torch runs its intra-op pool on OpenMP: the bridge then parks
    that pool's workers while ORT runs (``run_parked``). The library links ``libgomp.so.1``,
    which resolves to the OpenMP runtime torch already loaded."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        import torch
    except ImportError:
        return []
    return ["-fopenmp"] if torch._C.has_openmp else []


def objects_dir(plat_name: str) -> Path:
    """Where every build of this tree compiles the bridge: ``build/temp.<platform>-<python>``."""
    return ROOT / "build" / f"temp.{plat_name}-{sys.implementation.cache_tag}"


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def bridge_options() -> dict[str, Any]:
    """``setup()`` keywords that add the bridge; imports torch (the one the bridge is built against)."""
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        raise SystemExit(
            f"setup.py: building the bridge needs torch in the build environment ({e}). Install it "
            "first (pip install torch==2.13.0) and build with `pip install --no-build-isolation .`, "
            f"or set {BRIDGE_ENV}=0 for a pure-Python install without the bridge."
        ) from e

    config = build_config()
    flags = compiler_flags(config, torch.__version__)
    record = {
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_path": str(Path(torch.__file__).resolve().parent),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "config": config,
        "compiler_flags": flags,
        "python": sys.version.split()[0],
    }

    class BuildBridge(BuildExtension):
        """torch's ``BuildExtension`` that also writes ``_bridge_build.json`` next to the library."""

        def finalize_options(self) -> None:
            super().finalize_options()
            # every build of this tree (editable ones, which would get a new temporary directory
            # each time, wheels, `setup.py build`) compiles in the tree's build/: ninja reuses
            # the objects of an earlier build of the same torch and flags, and recompiles what
            # changed since (the sources, the headers they include)
            self.build_temp = str(objects_dir(self.plat_name))

        def build_extension(self, ext: Any) -> None:
            library = Path(self.get_ext_fullpath(ext.name))
            this_build = {**record, "library": library.name}
            objects = Path(self.build_temp)
            if objects.exists() and _read_record(objects / RECORD) != record:
                # objects of another torch or other flags (or unrecorded ones): compile afresh
                shutil.rmtree(objects)
                self.force = True
            if library.exists() and _read_record(library.parent / RECORD) != this_build:
                # setuptools skips a library newer than its sources: not when torch or flags changed
                self.force = True
            super().build_extension(ext)
            text = json.dumps(this_build, indent=2, sort_keys=True) + "\n"
            (library.parent / RECORD).write_text(text)
            (objects / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

        def copy_extensions_to_source(self) -> None:
            # editable installs: the library is copied into src/ort_lazy; its record goes with it
            super().copy_extensions_to_source()
            build_py = self.get_finalized_command("build_py")
            built = Path(self.build_lib) / "ort_lazy" / RECORD
            if built.is_file():
                shutil.copyfile(built, Path(build_py.get_package_dir("ort_lazy")) / RECORD)

    return {
        "ext_modules": [
            CppExtension(
                BRIDGE,
                sources=[str(Path("cpp") / "bridge.cpp")],
                extra_compile_args={"cxx": flags},
                extra_link_args=openmp_flags(),
            )
        ],
        "cmdclass": {"build_ext": BuildBridge},
    }


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__ too
    setup(**(bridge_options() if bridge_enabled() else {}))

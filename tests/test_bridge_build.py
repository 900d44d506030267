"""What the build produces: the wheel (tags, contents, build record), the bridge in it (imports,
registers its operator, carries the torch version it was compiled against), the pure-Python
build, and the errors when the bridge is unusable.

The bridge wheel is built once per test session (``build.py --build_wheel``, shared by the
xdist workers) unless ``build.py --build_wheel --test`` hands its own wheel over in
``ORT_LAZY_TEST_WHEEL``. ``ORT_LAZY_BUILD_BRIDGE=0`` (set by ``build.py`` without
``--enable_lazy_tensor``) skips the bridge checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock

from ort_lazy.frontends import jit as jit_frontend
from ort_lazy.runtime import bridge as bridge_runtime

ROOT = Path(__file__).resolve().parent.parent
TORCH_DIR = Path(torch.__file__).resolve().parent
BRIDGE_WANTED = os.environ.get("ORT_LAZY_BUILD_BRIDGE", "1") != "0"
INSTALLED = jit_frontend.bridge_info()
needs_bridge = pytest.mark.skipif(
    not BRIDGE_WANTED, reason="ORT_LAZY_BUILD_BRIDGE=0: built without the bridge"
)


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


build = _load("ort_lazy_build_driver_b", ROOT / "build.py")
setup_py = _load("ort_lazy_setup_py", ROOT / "setup.py")  # its functions; setup() runs as __main__ only


def build_config() -> str:
    """The configuration this session's bridge is built with: build.py's, else the installed one's."""
    return os.environ.get("ORT_LAZY_BUILD_CONFIG") or (INSTALLED or {}).get("config") or "Release"


@pytest.fixture(scope="session")
def bridge_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel with the bridge, built by build.py once per session (shared by xdist workers)."""
    if not BRIDGE_WANTED:
        pytest.skip("ORT_LAZY_BUILD_BRIDGE=0")
    given = os.environ.get(build.TEST_WHEEL_ENV)
    if given:
        return Path(given)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    shared = tmp_path_factory.getbasetemp().parent if run_id else tmp_path_factory.getbasetemp()
    with FileLock(str(shared / "ort-lazy-wheel.lock")):
        done = shared / f"ort-lazy-wheel-{run_id or 'solo'}.json"
        if done.is_file():
            return Path(json.loads(done.read_text()))
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "build.py"),
                "--no_venv",
                "--skip_deps",
                "--enable_lazy_tensor",
                "--build_wheel",
                "--config",
                build_config(),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        wheel = build.wheel_path(build.parse_args(["--enable_lazy_tensor", "--build_wheel"]))
        keep = shared / wheel.name  # dist/ may be rebuilt by a later session
        shutil.copyfile(wheel, keep)
        done.write_text(json.dumps(str(keep)))
        return keep


@pytest.fixture(scope="session")
def unpacked(bridge_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(bridge_wheel) as zf:
        zf.extractall(target)
    return target


def wheel_record(unpacked: Path) -> dict[str, Any]:
    return json.loads((unpacked / "ort_lazy" / "_bridge_build.json").read_text())


# --------------------------------------------------------------------------- the bridge wheel


@needs_bridge
def test_wheel_is_tagged_for_this_python_and_platform(bridge_wheel: Path, unpacked: Path) -> None:
    py, abi, platform = build.wheel_tags()
    assert bridge_wheel.name == f"ort_lazy-{build.package_version()}-{py}-{abi}-{platform}.whl"
    wheel_meta = next(unpacked.glob("ort_lazy-*.dist-info")) / "WHEEL"
    text = wheel_meta.read_text()
    assert f"Tag: {py}-{abi}-{platform}" in text and "Root-Is-Purelib: false" in text
    libs = sorted(p.name for p in (unpacked / "ort_lazy").glob("_bridge*"))
    assert libs == sorted([wheel_record(unpacked)["library"], "_bridge_build.json"])
    assert (unpacked / "ort_lazy" / "runtime" / "bridge.py").is_file()


@needs_bridge
def test_wheel_records_the_torch_and_flags_it_was_built_with(unpacked: Path) -> None:
    record = wheel_record(unpacked)
    assert record["torch_version"] == torch.__version__
    assert record["torch_cuda"] == torch.version.cuda
    assert record["config"] == build_config()
    assert record["compiler_flags"] == setup_py.compiler_flags(build_config(), torch.__version__)
    if os.environ.get(build.TEST_WHEEL_ENV) is None:
        # the flags recorded are the flags ninja compiled with (the build ran in this tree)
        ninja = next((ROOT / "build").glob("temp.*/build.ninja"), None)
        if ninja is not None:
            text = ninja.read_text()
            assert all(flag in text for flag in record["compiler_flags"]), record["compiler_flags"]


@needs_bridge
def test_wheel_bridge_imports_registers_its_operator_and_knows_its_torch(unpacked: Path) -> None:
    code = (
        "import json, torch\n"
        "def registered():\n"
        "    return torch._C._jit_get_operation('ort::CompilationGroup')[0] is not None\n"
        "before = registered()\n"
        "import ort_lazy\n"
        "from ort_lazy.runtime.bridge import load_bridge\n"
        "b = load_bridge()\n"
        "print(json.dumps({'file': ort_lazy.__file__, 'lib': b.__file__, 'before': before,\n"
        "                  'op': registered(), 'symbol': b.group_symbol(), 'torch': b.torch_version}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=unpacked)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(unpacked) and Path(got["lib"]).is_relative_to(unpacked)
    assert got["before"] is False and got["op"] is True, "the operator is registered by the bridge"
    assert got["symbol"] == "ort::CompilationGroup"
    assert got["torch"] == torch.__version__, "ORT_LAZY_TORCH_VERSION compiled in"


@needs_bridge
def test_installed_bridge_matches_the_running_torch() -> None:
    if INSTALLED is None:
        pytest.skip("no bridge in the installed ort_lazy (installed without --enable_lazy_tensor)")
    assert INSTALLED["torch_version"] == torch.__version__
    assert INSTALLED["compiler_flags"] == setup_py.compiler_flags(INSTALLED["config"], torch.__version__)
    if "ORT_LAZY_BUILD_CONFIG" in os.environ:  # build.py says which config it built
        assert INSTALLED["config"] == os.environ["ORT_LAZY_BUILD_CONFIG"]
    bridge = jit_frontend.load_bridge()
    assert bridge.torch_version == torch.__version__
    assert bridge.group_symbol() == "ort::CompilationGroup"


# --------------------------------------------------------------------------- the pure build


def _copy_tree(target: Path) -> Path:
    """The files a source distribution holds (no build outputs), to build in isolation."""
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "cpp", target / "cpp")
    shutil.copytree(
        ROOT / "src",
        target / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "_bridge.*", "_bridge_build.json"),
    )
    return target


#: runs setup.py's build in a process where `import torch` fails
_NO_TORCH = (
    "import runpy, sys; sys.modules['torch'] = None; sys.argv = ['setup.py', *sys.argv[1:]]; "
    "runpy.run_path('setup.py', run_name='__main__')"
)


def test_pure_wheel_builds_without_torch_and_is_py3_none_any(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    src = _copy_tree(tmp_path / "tree")
    env = {**os.environ, "ORT_LAZY_BUILD_BRIDGE": "0"}
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, "-q", "bdist_wheel", "-d", str(tmp_path / "dist")],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"ort_lazy-{build.package_version()}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "ort_lazy/runtime/bridge.py" in names
    assert not [n for n in names if "_bridge." in n or n.endswith("_bridge_build.json")]
    meta = zipfile.ZipFile(wheel).read(f"ort_lazy-{build.package_version()}.dist-info/METADATA").decode()
    assert "Requires-Python: <3.15,>=3.10" in meta or "Requires-Python: >=3.10,<3.15" in meta


def test_bridge_build_without_torch_says_how_to_go_pure(tmp_path: Path) -> None:
    env = {**os.environ, "ORT_LAZY_BUILD_BRIDGE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, "--name"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "ORT_LAZY_BUILD_BRIDGE=0" in out.stderr and "--no-build-isolation" in out.stderr
    bad = subprocess.run(
        [sys.executable, "setup.py", "--name"],
        cwd=ROOT,
        env={**os.environ, "ORT_LAZY_BUILD_BRIDGE": "maybe"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "must be 1 or 0" in bad.stderr


def test_setup_py_flags_per_config() -> None:
    std = f"-std=c++{setup_py.torch_cxx_standard()}"
    for config, flags in setup_py.CONFIGS.items():
        got = setup_py.compiler_flags(config, "2.13.0+cpu")
        if sys.platform != "win32":
            assert got == [std, *flags, "-DORT_LAZY_TORCH_VERSION=2.13.0+cpu", *setup_py.openmp_flags()]
    assert set(setup_py.CONFIGS) == set(build.CONFIGS) == set(setup_py.MSVC_CONFIGS)


def _headers_minimum_standard() -> int:
    """The oldest C++ standard the installed torch's headers accept, read here independently of
    setup.py: ``torch/all.h`` stops the build with ``#error`` below it."""
    text = (TORCH_DIR / "include/torch/csrc/api/include/torch/all.h").read_text()
    checks = re.findall(r"__cplusplus\s*<\s*(\d{4})(\d{2})L", text)
    assert checks, "torch/all.h no longer says which C++ standard it needs: read it again"
    return max(int(year) for year, _ in checks) % 100


def _standard_of(flags: list[str]) -> int:
    stds = [f for f in flags if f.startswith(("-std=", "/std:"))]
    assert len(stds) == 1, flags
    return int(re.fullmatch(r"(?:-std=|/std:)(?:c|gnu)\+\+(\d+)", stds[0]).group(1))


def test_setup_py_never_passes_an_older_standard_than_torch_needs() -> None:
    """The language level comes from the installed torch: never below what its headers require
    (C++17 on torch 2.13, C++20 on 2.14), nor below what torch builds its own extensions with."""
    needed = _headers_minimum_standard()
    for config in setup_py.CONFIGS:
        assert _standard_of(setup_py.compiler_flags(config, torch.__version__)) >= needed
    cmake = (TORCH_DIR / "share/cmake/Torch/TorchConfig.cmake").read_text()
    own = re.search(r"CXX_STANDARD\s+(\d+)", cmake)
    if own:
        assert setup_py.torch_cxx_standard() >= int(own.group(1))
    if INSTALLED:
        assert _standard_of(INSTALLED["compiler_flags"]) >= needed


def test_cxx_standard_is_read_from_torchs_files(tmp_path: Path) -> None:
    """A torch whose headers ask for C++20 gets C++20 even if its CMake file says 17; one whose
    files cannot be read gets C++17, the oldest any torch accepted."""
    headers = tmp_path / "include/torch/csrc/api/include/torch"
    headers.mkdir(parents=True)
    (headers / "all.h").write_text("#if !defined(_MSC_VER) && __cplusplus < 202002L\n#error C++20\n#endif\n")
    cmake = tmp_path / "share/cmake/Torch"
    cmake.mkdir(parents=True)
    (cmake / "TorchConfig.cmake").write_text("set_target_properties(torch PROPERTIES\n  CXX_STANDARD 17\n)\n")
    assert setup_py.torch_cxx_standard(tmp_path) == 20
    (headers / "all.h").write_text("#if __cplusplus < 201703L\n#error\n#endif\n")
    assert setup_py.torch_cxx_standard(tmp_path) == 17
    assert setup_py.torch_cxx_standard(tmp_path / "missing") == 17
    assert _standard_of(setup_py.compiler_flags("Release", "x", 23)) == 23


@pytest.mark.full
@pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler")
def test_bridge_source_is_valid_at_the_oldest_standard_torch_accepts(tmp_path: Path) -> None:
    """bridge.cpp compiles (syntax and templates) at the oldest standard the installed torch's
    headers accept (C++17 on torch 2.13), not only at the one the build picks."""
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    python = sysconfig.get_paths()["include"]
    cmd = [
        "c++",
        f"-std=c++{_headers_minimum_standard()}",
        "-fsyntax-only",
        "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        "-DORT_LAZY_TORCH_VERSION=x",
        *includes,
        f"-I{python}",
        str(ROOT / "cpp" / "bridge.cpp"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]


# --------------------------------------------------------------------------- clear errors


# --------------------------------------------------------------------------- reused objects


def _build_command(tmp_path: Path, editable: bool = False) -> tuple[Any, Any]:
    """setup.py's ``build_ext`` (of the torch running now) for a build of a tree at ``tmp_path``."""
    from setuptools import Distribution

    options = setup_py.bridge_options()
    (ext,) = options["ext_modules"]
    command = options["cmdclass"]["build_ext"](Distribution({"name": "ort-lazy", "ext_modules": [ext]}))
    command.build_lib = str(tmp_path / ("editable-lib" if editable else "lib"))
    command.editable_mode = editable
    command.ensure_finalized()
    return command, ext


def test_builds_reuse_objects_only_of_the_same_torch_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editable and wheel builds compile in the tree's ``build/temp.*``: one build finds the
    objects of another of the same torch and flags there (ninja then recompiles only what
    changed); other flags, another torch or objects without a record empty the directory
    first, and the build is forced (setuptools would skip a library newer than its sources)."""
    from torch.utils.cpp_extension import BuildExtension

    monkeypatch.setattr(setup_py, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)  # an editable build's library goes to the working directory
    found: list[list[str]] = []  # the objects each build found

    def compile_and_link(self: Any, ext: Any) -> None:  # stands in for ninja and the linker
        objects = Path(self.build_temp)
        found.append(sorted(p.name for p in objects.glob("*.o")))
        if found[-1] == []:
            assert self.force
        objects.mkdir(parents=True, exist_ok=True)
        (objects / "bridge.o").write_text(json.dumps(ext.extra_compile_args))
        library = Path(self.get_ext_fullpath(ext.name))
        library.parent.mkdir(parents=True, exist_ok=True)
        library.write_bytes(b"")

    monkeypatch.setattr(BuildExtension, "build_extension", compile_and_link)

    def build(editable: bool = False) -> None:
        command, ext = _build_command(tmp_path, editable)
        command.build_extension(ext)

    editable, wheel = _build_command(tmp_path, editable=True)[0], _build_command(tmp_path)[0]
    where = tmp_path / "build" / f"temp.{wheel.plat_name}-{sys.implementation.cache_tag}"
    assert Path(editable.build_temp) == Path(wheel.build_temp) == where

    build(editable=True)  # the first build: nothing to reuse
    build()  # then the wheel: the editable build's objects
    assert found == [[], ["bridge.o"]]
    assert json.loads((where / "_bridge_build.json").read_text())["torch_version"] == torch.__version__

    (where / "_bridge_build.json").unlink()  # objects nobody recorded: not trusted
    build()
    assert found[-1] == []

    monkeypatch.setenv("ORT_LAZY_BUILD_CONFIG", "Debug")  # other flags: from an empty directory
    build()
    assert found[-1] == []
    assert json.loads((where / "_bridge_build.json").read_text())["config"] == "Debug"
    build()
    assert found[-1] == ["bridge.o"]  # the same flags again: reused

    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "2.99.0+cpu")  # another torch, the same configuration
        build()
    assert found[-1] == []
    assert "-DORT_LAZY_TORCH_VERSION=2.99.0+cpu" in (where / "bridge.o").read_text()


@pytest.mark.full
@needs_bridge
@pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler")
def test_wheel_builds_recompile_only_when_flags_change(tmp_path: Path) -> None:
    """For real, in a copy of the tree: a second wheel of the same flags compiles nothing (its
    object is the first one's), a wheel of other flags compiles the bridge again."""
    (tmp_path / "tree").mkdir()
    tree = _copy_tree(tmp_path / "tree")

    def wheel(config: str) -> tuple[int, dict[str, Any]]:
        dist = tmp_path / f"dist-{config}-{len(list(tmp_path.glob('dist-*')))}"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-build-isolation",
                "--no-deps",
                "-w",
                str(dist),
                str(tree),
            ],
            env={**os.environ, "ORT_LAZY_BUILD_BRIDGE": "1", "ORT_LAZY_BUILD_CONFIG": config},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        (built,) = dist.glob("*.whl")
        record = json.loads(zipfile.ZipFile(built).read("ort_lazy/_bridge_build.json"))
        (o,) = (tree / "build").glob("temp.*/cpp/bridge.o")
        return o.stat().st_mtime_ns, record

    first, record = wheel("Debug")
    assert record["config"] == "Debug"
    again, record = wheel("Debug")
    assert again == first and record["config"] == "Debug"  # reused, not compiled
    other, record = wheel("RelWithDebInfo")
    assert other != first and record["config"] == "RelWithDebInfo"


def test_openmp_flags_follow_torch() -> None:
    # Linux with an OpenMP torch: the bridge is built with OpenMP (it parks torch's workers)
    expected = ["-fopenmp"] if sys.platform.startswith("linux") and torch._C.has_openmp else []
    assert setup_py.openmp_flags() == expected


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

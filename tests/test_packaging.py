"""Packaging checks: pyproject.toml, the conda recipe's variants, environment.yml and the CI matrix.

The recipe is rendered and linted offline with py-rattler-build (no channel needed). build.py's
decisions are tested in test_build_driver.py, what the build produces in test_bridge_build.py.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ort_lazy import _compat

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
#: the supported torch versions every declaration follows
SUPPORTED_TORCH = _compat.SUPPORTED_TORCH
supported_torch_range = _compat.supported_torch_range


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


def recipe_yaml() -> dict[str, Any]:
    return yaml.safe_load(RECIPE.read_text())


def pins(variant: Any, section: str) -> list[Any]:
    return [s for s in requirements(variant)[section] if isinstance(s, dict)]


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

    # pytorch: the variant's build in host (the bridge is compiled against it), exactly that in run
    torch_pin = f"=={build.TORCH_PIN.split('==')[1]}"
    assert by_name(requirements(cpu)["host"])["pytorch"] == [f"pytorch {torch_pin} cpu*"]
    assert by_name(requirements(cuda)["host"])["pytorch"] == [f"pytorch {torch_pin} cuda*"]
    for variant in (cpu, cuda):
        assert pins(variant, "run") == [{"pin_compatible": {"name": "pytorch", "exact": True}}]
        assert "pytorch" not in by_name(requirements(variant)["run"])
    # onnxruntime: conda-forge's CPU build (build string *_cpu) or its CUDA build (*_cuda<XY>)
    cpu_run, cuda_run = by_name(requirements(cpu)["run"]), by_name(requirements(cuda)["run"])
    assert [conda_requirement(s)[2] for s in cpu_run["onnxruntime"]] == ["*_cpu"]
    assert [conda_requirement(s)[2] for s in cuda_run["onnxruntime"]] == ["*_cuda*"]
    assert "__cuda" in cuda_run and "__cuda" not in cpu_run

    cuda_build = " ".join(requirements(cuda)["build"])
    assert f"cuda-nvcc_{platform}" in cuda_build and "cuda-nvcc" not in " ".join(requirements(cpu)["build"])
    assert any(s.startswith("cuda-version ==") for s in requirements(cuda)["host"])


def test_recipe_has_no_openvino_variant_and_says_how_conda_gets_it() -> None:
    """conda-forge has no OpenVINO build of onnxruntime and no onnxruntime-openvino: the recipe
    asks for neither and points conda users at the plugin (build.py --use_openvino is pip's)."""
    for platform in ("linux-64", "win-64"):
        for variant in render(platform, VARIANTS):
            specs = [s for section in requirements(variant).values() for s in section if isinstance(s, str)]
            assert not [s for s in specs if "openvino" in s], specs
    text = RECIPE.read_text()
    assert "onnxruntime-ep-openvino" in text and 'ep_libraries="onnxruntime_ep_openvino"' in text
    assert build.ORT_FLAVOURS["openvino"].startswith("onnxruntime-openvino==")


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


def test_recipe_requirements_match_pyproject() -> None:
    (cpu,) = render("linux-64", VARIANTS, ROOT / "ci" / "conda" / "cpu.yaml")
    run = {
        conda_requirement(s)[0]: conda_requirement(s)[1]
        for s in requirements(cpu)["run"]
        if isinstance(s, str)
    }
    for name, specifiers in project_requirements().items():
        if name == "torch":  # pinned to the host build (above), which must be in pyproject's range
            continue
        assert name in run, f"{name} missing from the recipe's run requirements"
        assert run[name] == specifiers, (name, run[name], specifiers)
    from packaging.specifiers import SpecifierSet

    pinned = next(iter(conda_requirement(by_name(requirements(cpu)["host"])["pytorch"][0])[1])).lstrip("=")
    assert pinned in SpecifierSet(",".join(project_requirements()["torch"])), pinned
    host = {conda_requirement(s)[0]: conda_requirement(s)[1] for s in requirements(cpu)["host"]}
    for req in PYPROJECT["build-system"]["requires"]:
        name, specifiers = pip_requirement(req)
        if name == "torch":
            assert specifiers == {f"=={pinned}"}, "pyproject's build requirement pins the recipe's torch"
        elif name == "ninja":
            assert "ninja" in by_name(requirements(cpu)["build"])
        else:
            assert host.get(name) == specifiers, (name, host.get(name), specifiers)


def test_recipe_build_script_is_a_standard_pip_build() -> None:
    for variant in render("linux-64", VARIANTS) + render("win-64", VARIANTS):
        script = variant.recipe.build.script
        content = script["content"]
        line = content if isinstance(content, str) else " ".join(content)
        argv = shlex.split(line)
        assert argv[0] == "${{" or argv[0].endswith("PYTHON"), line
        assert argv[argv.index("-m") + 1 :] == [
            "pip",
            "install",
            ".",
            "--no-build-isolation",
            "--no-deps",
            "-vv",
        ]
        assert script["env"] == {"ORT_LAZY_BUILD_BRIDGE": "1", "ORT_LAZY_BUILD_CONFIG": "Release"}


def source_files() -> set[str]:
    """The files the recipe's source filter keeps (rattler-build's own glob matcher)."""
    rb = pytest.importorskip("rattler_build")
    filt = recipe_yaml()["source"]["filter"]
    found = rb.collect_files(ROOT, include_globs=filt["include"], exclude_globs=filt["exclude"])
    return {str(f.destination).replace(os.sep, "/") for f in found}


def test_recipe_lint_source_holds_what_build_tests_and_license_need() -> None:
    """rattler-build stops on "No license files were copied" when the filter drops LICENSE."""
    files = source_files()
    about = recipe_yaml()["about"]
    licenses = about["license_file"] if isinstance(about["license_file"], list) else [about["license_file"]]
    assert set(licenses) <= files and (ROOT / "LICENSE").is_file()
    assert about["license"] == PYPROJECT["project"]["license"]
    build_inputs = {"setup.py", "pyproject.toml", "README.md", "cpp/bridge.cpp", "src/ort_lazy/__init__.py"}
    assert build_inputs <= files, build_inputs - files
    assert not [f for f in files if "_bridge." in f or f.endswith("_bridge_build.json") or ".egg-info" in f]
    assert not [f for f in files if "__pycache__" in f]
    # every test module the tests section runs, and what it imports, is in the source
    for variant in render("linux-64", VARIANTS):
        tests = variant.recipe.to_dict()["tests"]
        scripts = [line for t in tests if "script" in t for line in t["script"]]
        pytest_line = next(line for line in scripts if line.startswith("pytest"))
        modules = [a for a in shlex.split(pytest_line) if a.endswith(".py")]
        assert modules and set(modules) <= files, set(modules) - files
        assert {"tests/conftest.py", "tests/helpers.py"} <= files
        for module in modules:
            imports = re.findall(r"^(?:from|import) (\w+)", (ROOT / module).read_text(), re.M)
            allowed = {"__future__", "torch", "pytest", "ort_lazy", "helpers", *sys.stdlib_module_names}
            assert set(imports) <= allowed, (module, set(imports) - allowed)


def test_recipe_tests_run_the_subset_pip_check_and_bridge() -> None:
    raw = [t for t in recipe_yaml()["tests"] if "python" in t]
    assert raw and raw[0]["python"]["pip_check"] is True
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
        (python,) = [t["python"] for t in tests if "python" in t]
        assert {"ort_lazy", "ort_lazy._bridge"} <= set(python["imports"])
        assert python.get("pip_check", True) is True
        (script_test,) = [t for t in tests if "script" in t]
        cuda = variant.variant.get("cuda_compiler_version", "None") != "None"
        assert script_test["script"][0] == ("python run_test.py --cuda" if cuda else "python run_test.py")
        assert script_test["script"][1].startswith("pytest -q tests/")
        assert [conda_requirement(r)[0] for r in script_test["requirements"]["run"]] == ["pytest"]
        assert "tests/" in script_test["files"]["source"]


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
    assert have["python"][1] == set(PYPROJECT["project"]["requires-python"].split(","))


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
    assert set(wf["jobs"]) >= {"lint", "test", "full", "training", "openvino", "wheel", "conda"}
    lint = " ".join(s.get("run", "") for s in wf["jobs"]["lint"]["steps"])
    assert "ruff check" in lint


def supported_torches() -> list[str]:
    """``_compat.SUPPORTED_TORCH`` as CI's matrix spells the versions: ``["2.13", "2.14"]``."""
    return [f"{major}.{minor}" for major, minor in SUPPORTED_TORCH]


def supported_pythons() -> list[str]:
    """The minor versions pyproject's requires-python (">=3.X,<3.Y") admits."""
    m = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert m, "requires-python needs a lower and an upper bound"
    return [f"3.{minor}" for minor in range(int(m.group(1)), int(m.group(2)))]


def test_requires_python_is_what_torch_publishes_wheels_for() -> None:
    # torch 2.13.0 on PyPI: cp310, cp311, cp312, cp313, cp314 (and cp314t) wheels, none newer
    assert supported_pythons() == ["3.10", "3.11", "3.12", "3.13", "3.14"]
    classifiers = PYPROJECT["project"].get("classifiers", [])
    listed = [
        c.rsplit(" :: ", 1)[1]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert listed == supported_pythons()


def test_workflow_test_matrix() -> None:
    wf = workflow()
    matrix = wf["jobs"]["test"]["strategy"]["matrix"]
    assert matrix["python"] == supported_pythons(), "CI runs the suite on every supported Python"
    assert matrix["torch"] == supported_torches(), "CI runs the suite on every supported torch"
    assert {b["name"] for b in matrix["bridge"]} == {"on", "off"}
    assert "ubuntu-latest" in matrix["os"]
    assert any(inc["os"].startswith("windows") for inc in matrix["include"])
    shards = int(wf["env"]["SHARDS"])
    assert matrix["shard"] == list(range(shards))
    runs = build_py_invocations(wf["jobs"]["test"], wf["env"])
    windows = [inc for inc in matrix["include"] if inc["os"].startswith("windows")]
    following = [inc for inc in matrix["include"] if inc.get("next")]
    assert len(runs) == len(expand_matrix(matrix))
    assert len(runs) == len(supported_pythons()) * len(supported_torches()) * 2 * shards + len(windows) + len(
        following
    )
    # Windows: one Python, every supported torch (the bridge on for some, off for others)
    assert {inc["torch"] for inc in windows} == set(supported_torches())
    assert {inc["bridge"]["name"] for inc in windows} == {"on", "off"}
    # the next torch: the minor after the newest supported, both bridges, not required to pass
    major, minor = SUPPORTED_TORCH[-1]
    assert {inc["torch"] for inc in following} == {f"{major}.{minor + 1}"}
    assert {inc["bridge"]["name"] for inc in following} == {"on", "off"}
    assert wf["jobs"]["test"]["continue-on-error"] == "${{ matrix.next || false }}"
    assert not any(inc.get("next") for inc in windows)
    covered: dict[tuple, set[int]] = {}
    for combo, args in runs:
        assert args.test and not args.skip_tests and args.shards == shards and args.shard == combo["shard"]
        assert args.enable_lazy_tensor == (combo["bridge"]["name"] == "on")
        assert args.torch_spec == f"torch=={combo['torch']}.*"
        assert args.torch_index == wf["env"]["TORCH_CPU_INDEX"]
        key = (combo["os"], combo["python"], combo["torch"], combo["bridge"]["name"])
        covered.setdefault(key, set()).add(args.shard)
    assert all(s == set(range(shards)) for s in covered.values()), "every configuration runs every shard"


def test_declared_torch_range_is_the_supported_one() -> None:
    """pyproject's torch range, environment.yml's (checked against pyproject above), the README's
    and the recipe's pinned build all follow ``_compat.SUPPORTED_TORCH``."""
    low, high = supported_torch_range()
    assert project_requirements()["torch"] == {low, high}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    (pytorch,) = [
        conda_requirement(d) for d in env["dependencies"] if isinstance(d, str) and d.startswith("pytorch ")
    ]
    assert pytorch[1] == {low, high}
    versions = supported_torches()
    listed = ", ".join(versions[:-1]) + " and " + versions[-1] if len(versions) > 1 else versions[0]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"Supported torch: {listed} (`torch{low},{high}`)" in readme
    pinned = build.TORCH_PIN.split("==")[1]
    assert ".".join(pinned.split(".")[:2]) in versions, "build.py's default torch is a supported one"
    assert yaml.safe_load(VARIANTS.read_text())["pytorch"] == [pinned], (
        "the recipe builds on build.py's torch"
    )


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


def test_workflow_openvino_job() -> None:
    """The onnxruntime-openvino job: build.py --use_openvino on Linux, on a Python its wheels
    exist for, running OPENVINO_TESTS in the fast tier (SHARDS shards) and the full tier (as many
    shards as the full job)."""
    wf = workflow()
    job = wf["jobs"]["openvino"]
    assert job["runs-on"].startswith("ubuntu")
    (setup,) = [s for s in job["steps"] if "setup-python" in s.get("uses", "")]
    major, minor = (int(n) for n in str(setup["with"]["python-version"]).split("."))
    assert (major, minor) in build.OPENVINO_WHEELS.pythons, "a Python onnxruntime-openvino has wheels for"
    assert "linux-x86_64" in build.OPENVINO_WHEELS.platforms
    runs = build_py_invocations(job, wf["env"])
    assert len(runs) == len(expand_matrix(job["strategy"]["matrix"]))
    selected = wf["env"]["OPENVINO_TESTS"].split()
    assert "tests/opinfo" in selected
    # the OpInfo suite runs on OpenVINO's provider (its openvino flavour), not on the CPU provider alone
    assert job["env"]["ORT_LAZY_PROVIDERS"].split(",")[0] == "openvino"
    tiers: dict[bool, set[int]] = {}
    shards: dict[bool, set[int]] = {}
    for combo, args in runs:
        assert args.use_openvino and not args.use_cuda and not args.enable_training
        assert build.ort_requirement(args) == build.ORT_FLAVOURS["openvino"]
        assert args.test and not args.skip_tests and args.tests == selected
        assert args.enable_lazy_tensor and args.torch_index == wf["env"]["TORCH_CPU_INDEX"]
        assert args.full == (combo["tier"] == "full") and args.shard == combo["shard"]
        tiers.setdefault(args.full, set()).add(args.shard)
        shards.setdefault(args.full, set()).add(args.shards)
    (full_shards,) = {a.shards for _, a in build_py_invocations(wf["jobs"]["full"], wf["env"])}
    fast_shards = int(wf["env"]["SHARDS"])
    assert shards == {False: {fast_shards}, True: {full_shards}}
    assert tiers == {False: set(range(fast_shards)), True: set(range(full_shards))}, (
        "every shard of each tier"
    )


def test_github_workflow_is_the_ci_copy():
    """GitHub runs workflows only from .github/workflows: it must be the ci/ matrix, unchanged."""
    root = Path(__file__).resolve().parents[1]
    assert (root / ".github/workflows/build.yml").read_text() == (root / "ci/workflows/build.yml").read_text()


def test_ci_runs_exactly_the_readmes_test_commands() -> None:
    """``.ci/run`` calls the README's test commands, each as written there, and nothing that is
    not in the README: a step CI takes must be one a user can read and repeat."""
    ROOT = Path(__file__).resolve().parent.parent
    script = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip()
        and not line.lstrip().startswith("#")
        and line.strip() not in ("set -euo pipefail",)
        and not line.strip().startswith("cd ")
    ]
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = {line.strip() for block in blocks for line in block.splitlines() if line.strip()}
    steps = script
    assert steps and all(step in commands for step in steps), [s for s in steps if s not in commands]
    assert any("--test" in s and "--use_openvino" not in s for s in steps)
    assert any("--use_openvino" in s and "--test" in s for s in steps)


def test_the_lint_job_passes_here() -> None:
    """CI's lint job (``ruff check``, ``ruff format --check`` of the files it names) as it runs
    there: a change that only that job would catch is caught by the suite too."""
    steps = [s["run"] for s in workflow()["jobs"]["lint"]["steps"] if s.get("run", "").startswith("ruff ")]
    assert len(steps) >= 2
    for run in steps:
        out = subprocess.run(
            [sys.executable, "-m", *shlex.split(run)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, f"{run}:\n{out.stdout}{out.stderr}"

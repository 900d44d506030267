"""Bad inputs, settings, cache faults and what a newcomer sees: never crash, never mutate, never
ignore.

Every case runs in its own Python process (:func:`run_case`), so a crash (a segfault in native
code) fails that one test with its exit status instead of taking the test run down, and nothing
a case changes reaches another. The processes are forks of a server that has imported torch and
the ONNX libraries once (``forkserver.py``: a new interpreter's state, without five seconds of
imports per case). The seeded random test at the end draws a few hundred combinations of
options, devices, dtypes, functions and front doors (``random_cases.py``), in a few processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import forkserver

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

#: what every case starts with: warnings of the ort_lazy logger collected in WARNINGS, and
#: done(**facts) printing the facts the test asserts on
PRELUDE = textwrap.dedent(
    """
    import json, logging, os, sys
    import torch
    import ort_lazy
    from ort_lazy import metrics
    WARNINGS = []

    class _Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                WARNINGS.append(record.getMessage())

    logging.getLogger("ort_lazy").addHandler(_Collect())

    def done(**facts):
        facts.setdefault("warnings", WARNINGS)
        facts.setdefault("counters", metrics.counters())
        print("RESULT " + json.dumps(facts, default=str), flush=True)
    """
)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORT_LAZY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(TESTS), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def run_case(
    body: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 300, setup: str = ""
) -> dict[str, Any]:
    """Run ``body`` (after :data:`PRELUDE` and ``setup``) in a fresh interpreter; the facts it
    passed to ``done``. Fails the test when the process crashes, exits non-zero or never calls
    ``done``."""
    code = PRELUDE + textwrap.dedent(setup) + textwrap.dedent(body)
    proc = forkserver.run([sys.executable, "-c", code], env=_env(env), cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, f"{_exit_text(proc.returncode)}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"the case never reported\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``ort-lazy ARGS`` (as ``python -m ort_lazy.cli``) in ``cwd``; never a crash."""
    proc = forkserver.run([sys.executable, "-m", "ort_lazy.cli", *args], env=_env(env), cwd=cwd, timeout=timeout)
    assert proc.returncode >= 0, f"{_exit_text(proc.returncode)}\n{proc.stderr[-3000:]}"
    return proc


# ----------------------------------------------------------------------------- 1. devices


def test_meta_module_runs_in_pytorch_like_eager_and_aot_eager():
    facts = run_case(
        """
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).to("meta")
        x = torch.randn(3, 4, device="meta")
        outs = {}
        for name, f in (("eager", m), ("aot_eager", torch.compile(m, backend="aot_eager")), ("ort", torch.compile(m, backend="ort"))):
            torch._dynamo.reset()
            out = f(x)
            outs[name] = [str(out.device), list(out.shape), str(out.dtype)]
        torch._dynamo.reset()
        out_c = ort_lazy.compile(m)(x)
        done(outs=outs, compile=[str(out_c.device), list(out_c.shape)], fallbacks=metrics.fallbacks())
        """
    )
    assert facts["outs"]["ort"] == facts["outs"]["eager"] == facts["outs"]["aot_eager"] == ["meta", [3, 2], "torch.float32"]
    assert facts["compile"] == ["meta", [3, 2]]
    c = facts["counters"]
    assert c["ort_runs"] == 0 and c["compile_failures"] == 0 and c["export_failures"] == 0 and c["ort_failures"] == 0
    reasons = {r for rs in facts["fallbacks"].values() for r in rs}
    assert reasons == {"unsupported device (no ORT execution provider for it)"}, reasons


def test_meta_only_graph_with_factory_ops_and_training():
    facts = run_case(
        """
        def f(x):
            return torch.ones(3, device="meta") + torch.zeros(x.shape, device=x.device) * x.sum() + torch.arange(3, device=x.device)
        x = torch.randn(3, device="meta")
        out = torch.compile(f, backend="ort")(x)
        torch._dynamo.reset()
        m = torch.nn.Linear(3, 3).to("meta")
        xg = torch.randn(2, 3, device="meta", requires_grad=True)
        y = torch.compile(m, backend="ort")(xg)
        y.sum().backward()
        done(out=[str(out.device), list(out.shape)], grad=[str(xg.grad.device), list(xg.grad.shape)],
             wgrad=str(m.weight.grad.device), fallbacks=metrics.fallbacks())
        """
    )
    assert facts["out"] == ["meta", [3]] and facts["grad"] == ["meta", [2, 3]] and facts["wgrad"] == "meta"
    fb = facts["fallbacks"]
    assert fb["aten.ones.default"] == {"unsupported device (no ORT execution provider for it)": 1}
    assert all(set(r) == {"unsupported device (no ORT execution provider for it)"} for r in fb.values()), fb
    assert facts["counters"]["ort_runs"] == 0 and facts["counters"]["compile_failures"] == 0


def test_fx_and_explain_on_meta():
    facts = run_case(
        """
        import ort_lazy.fx
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to("meta")
        x = torch.randn(2, 4, device="meta")
        out = ort_lazy.fx.compile(m, [x])(x)
        report = ort_lazy.explain(m, x)
        done(out=[str(out.device), list(out.shape)], report=str(report), share=report.share_on_ort)
        """
    )
    assert facts["out"] == ["meta", [2, 4]]
    assert facts["share"] == 0.0 and "unsupported device" in facts["report"] and "move the tensors" in facts["report"]


def test_runner_refuses_tensors_ort_cannot_read():
    facts = run_case(
        """
        from torch.fx.experimental.proxy_tensor import make_fx
        from ort_lazy.export.fx import export_graph
        from ort_lazy.options import Options
        from ort_lazy.runtime.region import OrtRegion
        from ort_lazy.runtime.session import OrtRunner
        from ort_lazy.runtime.session_create import OrtInputError, OrtRunError
        gm = make_fx(lambda t: torch.sin(t) * 2, tracing_mode="fake")(torch.randn(4))
        model = export_graph(gm, "sin")
        runner = OrtRunner(model, Options(), torch.device("cpu"))
        errors = []
        try:
            runner.run([torch.ones(4, device="meta")])
        except OrtInputError as e:
            errors.append(str(e))
        again = runner.run([torch.zeros(4)])[0].tolist()  # the runner stays usable
        try:
            OrtRunner(model, Options(), torch.device("meta"))
            made = True
        except OrtRunError as e:
            made = str(e)
        # a region runs such a call in PyTorch and keeps ORT for the next
        region = OrtRegion("sin", gm, runner, Options(), tuple_output=False)
        meta = region(torch.ones(4, device="meta"))
        cpu = region(torch.zeros(4))
        done(errors=errors, again=again, made=made, meta=[str(meta.device), list(meta.shape)], cpu=cpu.tolist(),
             region_kept=region.runner is not None)
        """
    )
    assert len(facts["errors"]) == 1 and "'meta'" in facts["errors"][0] and "cannot read" in facts["errors"][0]
    assert facts["again"] == [0.0] * 4
    assert isinstance(facts["made"], str) and "meta" in facts["made"]
    assert facts["meta"] == ["meta", [4]] and facts["cpu"] == [0.0] * 4 and facts["region_kept"]
    c = facts["counters"]
    assert c["ort_runs"] == 2 and c["torch_runs"] == 1 and c["ort_failures"] == 0
    assert sum("cannot read" in w for w in facts["warnings"]) == 1


def test_fx_compiled_for_other_inputs_runs_them_like_eager():
    facts = run_case(
        """
        import ort_lazy.fx
        def f(x):
            return x + torch.ones(x.shape, dtype=x.dtype, device=x.device)
        g = ort_lazy.fx.compile(torch.nn.Sequential(torch.nn.ReLU()), [torch.randn(4)])
        h = ort_lazy.fx.compile(type("F", (torch.nn.Module,), {"forward": lambda self, x: f(x)})(), [torch.randn(4)])
        outs = {}
        for name, fn, x in (("meta", g, torch.randn(4, device="meta")), ("shape", g, -torch.ones(3)),
                            ("dtype", g, torch.arange(4)), ("factory", h, torch.randn(2, 2, device="meta"))):
            out = fn(x)
            outs[name] = [str(out.device), list(out.shape), str(out.dtype)]
        ok = g(torch.ones(4)).tolist()
        done(outs=outs, ok=ok)
        """
    )
    assert facts["outs"] == {
        "meta": ["meta", [4], "torch.float32"],
        "shape": ["cpu", [3], "torch.float32"],
        "dtype": ["cpu", [4], "torch.int64"],
        "factory": ["meta", [2, 2], "torch.float32"],
    }
    assert facts["ok"] == [1.0] * 4
    c = facts["counters"]
    assert c["ort_runs"] == 1 and c["torch_runs"] == 4 and c["ort_failures"] == 0  # ORT kept for matching calls
    about = [w for w in facts["warnings"] if "compiled by ort_lazy.fx.compile for other inputs" in w]
    assert len(about) == 4 and "device meta" in about[0] and "compile again" in about[0]


def test_torchscript_groups_with_meta_tensors():
    from ort_lazy.frontends import jit as jit_frontend

    try:
        jit_frontend.load_bridge()
    except jit_frontend.BridgeUnavailableError as e:
        pytest.skip(f"bridge not built: {e}")
    facts = run_case(
        """
        import ort_lazy.jit
        def f(x):
            return torch.sin(x) * 2 + x
        devices = {}
        for first in ("cpu", "meta"):
            s = torch.jit.trace(f, torch.randn(4, device=first))
            with ort_lazy.jit.enable():
                for dev in (first, first, "meta" if first == "cpu" else "cpu", first, first):
                    out = s(torch.ones(4, device=dev))
                    devices.setdefault(first, []).append(str(out.device))
        done(devices=devices, fallbacks=metrics.fallbacks())
        """
    )
    assert facts["devices"] == {"cpu": ["cpu", "cpu", "meta", "cpu", "cpu"], "meta": ["meta", "meta", "cpu", "meta", "meta"]}
    c = facts["counters"]
    assert c["ort_runs"] >= 2 and c["ort_failures"] == 0
    reasons = {r for rs in facts["fallbacks"].values() for r in rs}
    assert reasons <= {"unsupported device (no ORT execution provider for it)"}, reasons


# ----------------------------------------------------------------------------- 2. no side effects


def test_compiling_does_not_touch_model_or_inputs():
    facts = run_case(
        """
        import copy
        import ort_lazy.fx

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)
                self.bn = torch.nn.BatchNorm1d(3)
                self.register_buffer("calls", torch.zeros(1))
            def forward(self, x):
                x.add_(1)
                self.calls += 1
                return self.bn(self.lin(x))

        m = M().train()
        x = torch.randn(4, 3)
        state, x0 = copy.deepcopy(m.state_dict()), x.clone()
        unchanged = {}
        f = ort_lazy.fx.compile(m, [x])
        unchanged["fx"] = all(torch.equal(v, state[k]) for k, v in m.state_dict().items()) and torch.equal(x, x0)
        c = torch.compile(m, backend="ort")
        unchanged["torch.compile"] = all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
        ort_lazy.explain(m, x, backward=True)
        unchanged["explain"] = (all(torch.equal(v, state[k]) for k, v in m.state_dict().items()) and torch.equal(x, x0)
                                and m.lin.weight.grad is None)
        # a call does what eager does, once
        ref, xr = copy.deepcopy(m), x.clone()
        out, expected = f(x), ref(xr)
        done(unchanged=unchanged, err=float((out - expected).abs().max()), x_same=torch.equal(x, xr),
             batches=[int(m.bn.num_batches_tracked), int(ref.bn.num_batches_tracked)],
             stats=float((m.bn.running_mean - ref.bn.running_mean).abs().max()), calls=[float(m.calls), float(ref.calls)])
        """
    )
    assert facts["unchanged"] == {"fx": True, "torch.compile": True, "explain": True}
    assert facts["err"] < 1e-5 and facts["x_same"] and facts["batches"] == [1, 1] and facts["stats"] < 1e-6
    assert facts["calls"] == [1.0, 1.0]


# ----------------------------------------------------------------------------- 3. late failures


def test_unwritable_metrics_file_is_no_failure(tmp_path):
    facts = run_case(
        """
        f = torch.compile(lambda t: torch.sin(t) * 2, backend="ort")
        x = torch.randn(5)
        ok = [torch.allclose(f(x), torch.sin(x) * 2) for _ in range(2)]
        f2 = torch.compile(lambda t: torch.cos(t) + 1, backend="ort")
        ok.append(torch.allclose(f2(x), torch.cos(x) + 1, atol=1e-6))  # cos differs by ulps near -1
        done(ok=ok)
        """,
        env={"ORT_LAZY_METRICS_FILE": str(tmp_path / "missing" / "dir" / "metrics.jsonl")},
    )
    assert facts["ok"] == [True, True, True]
    c = facts["counters"]
    assert c["ort_runs"] == 3 and c["compile_failures"] == c["export_failures"] == c["ort_failures"] == 0
    assert c["fallback_ops"] == 0
    assert sum("ORT_LAZY_METRICS_FILE" in w for w in facts["warnings"]) == 1  # warned once, not per graph
    assert not any(w for w in facts["warnings"] if "ORT_LAZY_METRICS_FILE" not in w), facts["warnings"]


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_failure_after_the_graph_changed_runs_the_original_graph(grad):
    facts = run_case(
        f"""
        from ort_lazy import partition
        def late(*a, **k):
            raise RuntimeError("injected failure after fusing")
        partition.save_support_table = late  # runs after the regions replaced the graph's nodes
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        x = torch.randn(3, 4)
        with torch.set_grad_enabled({grad}):
            expected = m(x)
            f = torch.compile(m, backend="ort")
            outs = [f(x) for _ in range(2)]
        err = max(float((o - expected).abs().max()) for o in outs)
        grad_ok = None
        if {grad}:
            outs[0].sum().backward()
            g = m[0].weight.grad.clone()
            m.zero_grad()
            expected.sum().backward()
            grad_ok = torch.allclose(g, m[0].weight.grad)
        done(err=err, grad_ok=grad_ok)
        """
    )
    assert facts["err"] == 0.0  # the untouched graph ran in PyTorch: bit-identical to eager
    c = facts["counters"]
    assert c["compile_failures"] >= 1 and c["export_failures"] == 0 and c["ort_runs"] == 0
    assert facts["grad_ok"] in (None, True)
    assert any("injected failure after fusing" in w for w in facts["warnings"])


# ----------------------------------------------------------------------------- 4. settings


def test_misspelt_op_names_raise_with_did_you_mean():
    facts = run_case(
        """
        from ort_lazy import Options, OptionsError
        errors = {}
        for key, call in {
            "Options": lambda: Options(torch_executed_ops="aten.reluu"),
            "overload": lambda: Options(torch_executed_ops="aten.add.Tensr"),
            "bare": lambda: Options(torch_executed_ops="gelu_"),
            "compile": lambda: ort_lazy.compile(torch.nn.ReLU(), torch_executed_ops=["aten::reluu"]),
            "env": lambda: Options.from_env({"ORT_LAZY_TORCH_EXECUTED_OPS": "aten.relu,aten.reluu"}),
        }.items():
            try:
                call()
                errors[key] = None
            except OptionsError as e:
                errors[key] = str(e)
        good = sorted(Options(torch_executed_ops="aten::relu,torch.ops.aten.gelu.default, aten.add.Tensor").torch_executed_ops)
        done(errors=errors, good=good)
        """
    )
    e = facts["errors"]
    assert "did you mean aten.relu" in e["Options"] and "torch_executed_ops" in e["Options"]
    assert "did you mean aten.add.Tensor" in e["overload"]
    assert "aten.gelu" in e["bare"]
    assert "aten::reluu" in e["compile"] and "did you mean aten.relu" in e["compile"]
    assert e["env"].startswith("ORT_LAZY_TORCH_EXECUTED_OPS=") and "did you mean aten.relu" in e["env"]
    assert facts["good"] == ["aten.add.Tensor", "aten.gelu.default", "aten.relu"]


def test_unknown_ort_lazy_variable_is_warned_once():
    facts = run_case(
        """
        for _ in range(3):
            torch._dynamo.reset()
            torch.compile(lambda t: t + 1, backend="ort")(torch.ones(2))
        done()
        """,
        env={"ORT_LAZY_DYNMAIC": "0", "ORT_LAZY_METRICS_FILE": os.devnull, "ORT_LAZY_ZOO_FULL": "0"},
    )
    about = [w for w in facts["warnings"] if "ORT_LAZY_" in w]
    assert len(about) == 1, facts["warnings"]
    assert "ORT_LAZY_DYNMAIC" in about[0] and "did you mean ORT_LAZY_DYNAMIC" in about[0]


def test_session_options_are_checked_when_made():
    facts = run_case(
        """
        from ort_lazy import Options, OptionsError
        errors = {}
        for key, value in {
            "typo": {"intra_op_num_thread": 2},
            "method": {"add_initializer": 1},
            "type": {"intra_op_num_threads": "two"},
            "enum": {"graph_optimization_level": "fastest"},
        }.items():
            try:
                Options(session_options=value)
                errors[key] = None
            except OptionsError as e:
                errors[key] = str(e)
        ok = Options(session_options={"graph_optimization_level": "ORT_ENABLE_BASIC", "session.intra_op.allow_spinning": False,
                                      "intra_op_num_threads": 1})
        f = torch.compile(lambda t: t * 3, backend="ort", options={"session_options": dict(ok.session_options)})
        done(errors=errors, out=f(torch.ones(2)).tolist())
        """
    )
    e = facts["errors"]
    assert "did you mean intra_op_num_threads" in e["typo"]
    assert "no attribute 'add_initializer'" in e["method"]
    assert "intra_op_num_threads='two'" in e["type"] and "int" in e["type"]
    assert "ORT_ENABLE_BASIC" in e["enum"]
    assert facts["out"] == [3.0, 3.0] and facts["counters"]["ort_runs"] == 1


def test_provider_missing_from_the_installed_flavour():
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    facts = run_case(
        """
        from ort_lazy import OptionsError
        try:
            torch.compile(lambda t: t + 1, backend="ort")(torch.ones(2))
            error = None
        except Exception as e:
            error = str(e)
        done(error=error)
        """,
        env={"ORT_LAZY_PROVIDERS": "cuda"},
    )
    error = facts["error"]
    assert error is not None and "CUDAExecutionProvider is not in the installed onnxruntime flavour (onnxruntime" in error
    assert "python build.py --use_cuda" in error
    assert facts["counters"]["fallback_ops"] == 0  # not "every op falls back as no ORT kernel"


def test_min_block_size_that_leaves_nothing_on_ort_is_warned_once_per_value():
    facts = run_case(
        """
        for size in (5, 5, 7):
            torch._dynamo.reset()
            f = torch.compile(lambda t: torch.sin(t) + 1, backend="ort", options={"min_block_size": size})
            f(torch.ones(3))
        done()
        """
    )
    about = [w for w in facts["warnings"] if "min_block_size" in w]
    assert len(about) == 2 and "min_block_size=5" in about[0] and "min_block_size=7" in about[1], about
    assert "ORT_LAZY_MIN_BLOCK_SIZE" in about[0]


def test_options_that_are_not_a_mapping_are_refused():
    facts = run_case(
        """
        import ort_lazy.fx
        errors = {}
        calls = {
            "torch.compile": lambda: torch.compile(lambda t: t + 1, backend="ort", options=["min_block_size", 2])(torch.ones(2)),
            "ort_lazy.compile": lambda: ort_lazy.compile(lambda t: t + 1, options=["min_block_size", 2]),
            "fx": lambda: ort_lazy.fx.compile(torch.nn.ReLU(), [torch.ones(2)], options=("min_block_size",)),
            "explain": lambda: ort_lazy.explain(lambda t: t + 1, torch.ones(2), options="min_block_size=2"),
        }
        for key, call in calls.items():
            try:
                call()
                errors[key] = None
            except Exception as e:
                errors[key] = str(e)
        # a mapping is fine everywhere
        out = ort_lazy.compile(lambda t: t + 1, options={"min_block_size": 1})(torch.ones(2)).tolist()
        done(errors=errors, out=out)
        """
    )
    for key, error in facts["errors"].items():
        assert error is not None and "expected a mapping of option names to values" in error, (key, error)
    assert facts["out"] == [2.0, 2.0]


def test_environment_is_read_when_the_graph_is_compiled():
    facts = run_case(
        """
        f = torch.compile(lambda t: torch.sin(t) * 2, backend="ort")
        os.environ["ORT_LAZY_TORCH_EXECUTED_OPS"] = "aten.sin"
        os.environ["ORT_LAZY_RUN_TYPE"] = "pytorch"
        x = torch.randn(4)
        ok = torch.allclose(f(x), torch.sin(x) * 2)
        done(ok=ok, fallbacks=metrics.fallbacks())
        """
    )
    assert facts["ok"]
    assert facts["fallbacks"]["aten.sin.default"] == {"excluded by the user (torch_executed_ops)": 1}
    c = facts["counters"]
    assert c["ort_runs"] == 0 and c["torch_runs"] >= 1  # run_type=pytorch took effect too


# ----------------------------------------------------------------------------- 5. cache faults

#: compiles two graphs through the cache; `cache` is the directory (set by each case)
CACHE_RUN = """
def run_twice():
    xs = torch.randn(3, 5)
    outs = []
    for fn in (lambda t: torch.tanh(t) * 2, lambda t: torch.cos(t) - t):
        torch._dynamo.reset()
        f = torch.compile(fn, backend="ort", options={"cache_dir": str(cache)})
        # ORT's cos and PyTorch's differ by up to 4.8e-7: cos(t) - t near its root needs an atol
        outs.append(torch.allclose(f(xs), fn(xs), rtol=1e-5, atol=1e-6))
    return outs
"""


def _cache_facts(facts: dict[str, Any]) -> None:
    """ORT ran every graph and nothing was labelled an export (or any) failure."""
    c = facts["counters"]
    assert facts["ok"] == [True, True]
    assert c["ort_runs"] == 2 and c["export_failures"] == c["compile_failures"] == c["ort_failures"] == 0, c
    assert c["fallback_ops"] == 0, c


def test_cache_read_only_with_corrupt_entry_whose_removal_fails(tmp_path):
    facts = run_case(
        f"""
        import pathlib
        cache = pathlib.Path({str(tmp_path / "c")!r})
        run_twice()  # fills the cache
        for p in cache.glob("*.onnx"):
            p.write_bytes(b"garbage")  # every entry now fails its hash check
        real_unlink = pathlib.Path.unlink
        def read_only(self, *a, **k):
            raise PermissionError(30, "Read-only file system", str(self))
        pathlib.Path.unlink = read_only
        import tempfile
        def no_temp(*a, **k):
            raise OSError(30, "Read-only file system")
        tempfile.mkstemp = no_temp
        metrics.reset()
        WARNINGS.clear()
        ok = run_twice()
        done(ok=ok)
        """,
        setup=CACHE_RUN,
    )
    _cache_facts(facts)
    assert facts["counters"]["disk_cache_rejected"] == 2
    writes = [w for w in facts["warnings"] if "cannot write the compile cache" in w]
    assert len(writes) == 1 and "Read-only" in writes[0]


def test_cache_disk_full_on_write(tmp_path):
    facts = run_case(
        f"""
        import errno, os, pathlib
        cache = pathlib.Path({str(tmp_path / "c")!r})
        real_replace = os.replace
        def full(src, dst):
            raise OSError(errno.ENOSPC, "No space left on device")
        os.replace = full
        ok = run_twice()
        done(ok=ok, left=sorted(p.name for p in cache.iterdir()))
        """,
        setup=CACHE_RUN,
    )
    _cache_facts(facts)
    assert facts["left"] == []  # no temporary file left behind
    about = [w for w in facts["warnings"] if "compile cache" in w]
    assert len(about) == 1 and "No space left" in about[0]


def test_cache_path_that_is_a_file(tmp_path):
    (tmp_path / "cachefile").write_text("not a directory")
    facts = run_case(
        f"""
        import pathlib
        cache = pathlib.Path({str(tmp_path / "cachefile")!r})
        done(ok=run_twice())
        """,
        setup=CACHE_RUN,
    )
    _cache_facts(facts)
    about = [w for w in facts["warnings"] if "cache" in w]
    assert len(about) == 1 and "is not a directory (a file is in the way)" in about[0] and "Errno" not in about[0]


def test_cache_permission_denied(tmp_path):
    facts = run_case(
        f"""
        import pathlib
        cache = pathlib.Path({str(tmp_path / "locked" / "c")!r})
        real_mkdir = pathlib.Path.mkdir
        def denied(self, *a, **k):
            raise PermissionError(13, "Permission denied", str(self))
        pathlib.Path.mkdir = denied
        ok = run_twice()
        pathlib.Path.mkdir = real_mkdir
        # an existing directory whose files cannot be read
        cache2 = pathlib.Path({str(tmp_path / "c2")!r})
        cache2.mkdir(mode=0o700)
        real_exists = pathlib.Path.exists
        def unreadable(self):
            if self.parent == cache2:
                raise PermissionError(13, "Permission denied", str(self))
            return real_exists(self)
        pathlib.Path.exists = unreadable
        real_read = pathlib.Path.read_text
        def unreadable_text(self, *a, **k):
            if self.parent == cache2:
                raise PermissionError(13, "Permission denied", str(self))
            return real_read(self, *a, **k)
        pathlib.Path.read_text = unreadable_text
        cache = cache2
        ok2 = run_twice()
        done(ok=ok, ok2=ok2)
        """,
        setup=CACHE_RUN,
    )
    assert facts["ok2"] == [True, True]
    c = facts["counters"]
    assert c["ort_runs"] == 4 and c["export_failures"] == c["compile_failures"] == c["ort_failures"] == 0
    disabled = [w for w in facts["warnings"] if "compile cache disabled" in w]
    unreadable = [w for w in facts["warnings"] if "cannot read the compile cache" in w]
    assert len(disabled) == 1 and "Permission denied" in disabled[0]
    assert len(unreadable) == 1


def test_cache_directory_permissions_are_respected(tmp_path):
    import stat

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o770)
    facts = run_case(
        f"""
        import pathlib
        results = {{}}
        for name in ("shared", "new/nested", "group"):
            cache = pathlib.Path({str(tmp_path)!r}) / name
            results[name] = run_twice()
        done(ok=[True, True], results=results)
        """,
        setup=CACHE_RUN,
    )
    assert all(v == [True, True] for v in facts["results"].values()), facts
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755  # kept as the user made it
    assert list(shared.glob("*.onnx"))  # and used
    assert stat.S_IMODE((tmp_path / "new" / "nested").stat().st_mode) == 0o700  # created private
    assert not list(group.glob("*.onnx"))  # writable by others: refused
    assert sum("writable by other users" in w for w in facts["warnings"]) == 1
    c = facts["counters"]
    assert c["export_failures"] == c["compile_failures"] == 0 and c["ort_runs"] == 6


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores file permissions")
def test_cache_in_a_real_read_only_directory(tmp_path):
    cache = tmp_path / "ro"
    facts = run_case(f"import pathlib\ncache = pathlib.Path({str(cache)!r})\ndone(ok=run_twice())\n", setup=CACHE_RUN)
    for p in cache.glob("*.onnx"):
        p.write_bytes(b"garbage")
    os.chmod(cache, 0o500)
    try:
        facts = run_case(f"import pathlib\ncache = pathlib.Path({str(cache)!r})\ndone(ok=run_twice())\n", setup=CACHE_RUN)
    finally:
        os.chmod(cache, 0o700)
    _cache_facts(facts)
    assert sum("cannot write the compile cache" in w for w in facts["warnings"]) == 1


# ----------------------------------------------------------------------------- 6. newcomers


def test_explain_shows_graph_breaks_and_compute_share(tmp_path):
    (tmp_path / "user_code.py").write_text(
        textwrap.dedent(
            """
            import torch

            def f(x):
                y = torch.sin(x).t() * 2
                print("side effect")
                return y.detach().relu() + 1

            def g(x):
                a = torch.sin(x)
                b = torch.nextafter(a, a + 1)
                return torch.cos(b)
            """
        )
    )
    facts = run_case(
        f"""
        sys.path.insert(0, {str(tmp_path)!r})
        from user_code import f, g
        report = ort_lazy.explain(f, torch.randn(4, 3))
        order = ort_lazy.explain(g, torch.randn(3))
        done(text=str(report), d=report.as_dict(), order=str(order), steps=order.as_dict()["graphs"][0]["steps"])
        """
    )
    text, d = facts["text"], facts["d"]
    head = text.splitlines()[0]
    assert "1 graph break(s)" in head and "runs in Python" in head  # not a bare "100% on ORT"
    assert 'runs in Python: print("side effect")' in text and "user_code.py:6" in text
    assert d["graph_breaks"][0]["code"] == 'print("side effect")' and d["dynamo_graphs"] == 2
    # compute ops only: sin, mul, relu, add (not t, detach)
    assert d["ops_total"] == 4, d
    steps = facts["steps"]
    assert [s["where"] for s in steps] == ["ort", "pytorch", "ort"], steps
    assert steps[1]["ops"][0]["op"] == "prims.nextafter.default"
    lines = facts["order"].splitlines()
    first = next(i for i, ln in enumerate(lines) if "aten.sin" in ln)
    middle = next(i for i, ln in enumerate(lines) if "PyTorch  prims.nextafter" in ln)
    last = next(i for i, ln in enumerate(lines) if "aten.cos" in ln and "ORT" in ln)
    assert first < middle < last


def test_cli_explain_from_any_directory(tmp_path):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "helper.py").write_text("import torch\ndef make_model():\n    return torch.nn.Linear(3, 2)\n")
    (project / "pkg" / "zoo.py").write_text(
        "import torch\nfrom pkg.helper import make_model\n"
        "def make():\n    return make_model(), (torch.randn(4, 3),)\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    by_path = run_cli(["explain", str(project / "pkg" / "zoo.py") + ":make"], cwd=elsewhere, env={"PYTHONPATH": f"{SRC}{os.pathsep}{project}"})
    assert by_path.returncode == 0, by_path.stderr[-2000:]
    assert "compute ops of the captured graphs on ORT" in by_path.stdout
    relative = run_cli(["explain", "project/pkg/zoo.py:make"], cwd=tmp_path, env={"PYTHONPATH": f"{SRC}{os.pathsep}{project}"})
    assert relative.returncode == 0, relative.stderr[-2000:]
    dotted = run_cli(["explain", "pkg.zoo:make"], cwd=project)
    assert dotted.returncode == 0, dotted.stderr[-2000:]
    on_path = run_cli(["explain", "pkg.zoo:make", "--json"], cwd=elsewhere, env={"PYTHONPATH": f"{SRC}{os.pathsep}{project}"})
    assert on_path.returncode == 0 and json.loads(on_path.stdout)["ops_total"] >= 1, on_path.stderr[-2000:]
    missing = run_cli(["explain", "nosuchmodule:make"], cwd=elsewhere)
    assert missing.returncode != 0 and "no module named 'nosuchmodule'" in missing.stderr and "Traceback" not in missing.stderr
    unknown = run_cli(["explain", "mpl"], cwd=elsewhere)
    assert unknown.returncode != 0 and "did you mean mlp" in unknown.stderr
    for name in ("seed", "mlp", "transformer", "cnn", "gpt"):
        assert name in unknown.stderr


def test_cli_demo_explains_its_table(tmp_path):
    proc = run_cli(["demo", "--models", "seed,cnn", "--reps", "3"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for word in ("ratio", "status", "1st call s", "max err", "ort runs"):
        assert any(line.startswith(word) for line in out.splitlines()), (word, out)
    rows = [line for line in out.splitlines() if line.startswith(("seed", "cnn"))]
    for line in rows:
        if " n/a " in f" {line} " or "bridge not built" in line:
            assert "runs only" in line or "build.py" in line, line  # every n/a says why
    for line in rows:
        if line.startswith("seed") and (" jit " in line or " lazy " in line) and " ok " in line:
            first = float(line.split("x", 1)[1].split()[0])
            assert first > 0.0, line  # the calls until ORT ran, compiling included: not 0.00


@pytest.mark.full
def test_bench_quick_reports_targets_as_information_and_leaks_no_configuration(tmp_path):
    facts = run_case(
        f"""
        import contextlib, importlib.util, io
        import torch._inductor.config as inductor_config
        import torch._functorch.config as functorch_config
        before = (inductor_config.fx_graph_cache, inductor_config.force_disable_caches, functorch_config.enable_autograd_cache,
                  torch._dynamo.config.cache_size_limit, os.environ.get("TORCHINDUCTOR_CACHE_DIR"), torch.get_num_threads())
        spec = importlib.util.spec_from_file_location("bench", {str(TESTS.parent / "benchmarks" / "bench.py")!r})
        bench = importlib.util.module_from_spec(spec)
        sys.modules["bench"] = bench
        spec.loader.exec_module(bench)
        text = bench.format_targets([{{"target": "x", "value": 2.0, "limit": 1.0, "met": False}}], informational=True)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = bench.main(["--models", "seed", "--modes", "inference", "--backends", "eager,ort", "--quick",
                             "--threads", "1", "--json", "", "--png", ""])
        after = (inductor_config.fx_graph_cache, inductor_config.force_disable_caches, functorch_config.enable_autograd_cache,
                 torch._dynamo.config.cache_size_limit, os.environ.get("TORCHINDUCTOR_CACHE_DIR"), torch.get_num_threads())
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch._dynamo.reset()
            torch.compile(lambda t: t + 1, backend="ort")(torch.ones(2))
        done(rc=rc, text=text, before=before, after=after, caught=[str(w.message) for w in caught])
        """
    )
    assert facts["rc"] == 0
    assert "MISS" not in facts["text"] and "informational" in facts["text"] and "[info]" in facts["text"]
    assert facts["before"] == facts["after"]
    assert not [w for w in facts["caught"] if "force_disable_caches" in w], facts["caught"]


# ----------------------------------------------------------------------------- 7. random


RANDOM_SEED = 20250101
RANDOM_CASES = 320
RANDOM_CHUNKS = 4


@pytest.mark.parametrize("chunk", [c if c == 0 else pytest.param(c, marks=pytest.mark.full) for c in range(RANDOM_CHUNKS)])
def test_random_options_devices_dtypes_never_crash(chunk):
    """A seeded draw of options (valid and invalid), devices (cpu, meta), the seven dtypes,
    functions and front doors: every result equals eager's, or eager raises too, or the error
    names the setting to fix; never a crash. Cases run in ``RANDOM_CHUNKS`` processes: the
    first by default, all of them in the full tier."""
    per = RANDOM_CASES // RANDOM_CHUNKS
    proc = forkserver.run(
        [sys.executable, str(TESTS / "random_cases.py"), str(RANDOM_SEED), str(chunk * per), str(per)],
        env=_env(),
        timeout=600,
    )
    lines = proc.stdout.splitlines()
    started = {ln.split()[1]: ln for ln in lines if ln.startswith("CASE ")}
    finished = {ln.split()[1]: ln for ln in lines if ln.startswith("DONE ")}
    crashed = [started[i] for i in started if i not in finished]
    assert proc.returncode == 0 and not crashed, f"{_exit_text(proc.returncode)} in {crashed}\n{proc.stderr[-3000:]}"
    failures = [f"{started[i]}\n    {ln}" for i, ln in finished.items() if not ln.split(" ", 2)[2].startswith("ok")]
    assert not failures, "\n".join(failures)
    summary = json.loads(next(ln for ln in lines if ln.startswith("SUMMARY "))[len("SUMMARY ") :])
    assert summary["ok"] == per
    assert summary["ort_ran"] >= per // 5, summary  # a good share really ran on ORT

"""The ``ort-lazy`` command: ``info``, ``demo``, ``explain``, ``save`` and ``bench``."""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "info", "demo"]


def info() -> dict[str, Any]:
    """Versions, ORT flavour and providers, bridge state and CUDA availability.

    ``torch_supported`` says whether the running torch is one ort-lazy supports
    (``_compat.SUPPORTED_TORCH``); when it is not, ``torch_warning`` says why, and the
    ``ort-lazy info`` command prints it as a warning.
    """
    import torch

    from . import _compat
    from ._version import __version__
    from .runtime import flavour

    ort = flavour.onnxruntime()
    unsupported = _compat.unsupported_torch_message()
    out: dict[str, Any] = {
        "ort_lazy": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_supported": unsupported is None,
        **({"torch_warning": unsupported} if unsupported else {}),
        "onnxruntime": ort.__version__,
        "onnxruntime_flavour": flavour.flavour(),
        "max_onnx_ir_version": flavour.max_ir_version(),
        "providers": list(ort.get_available_providers()),
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    try:
        import onnx
        import onnxscript

        out["onnx"] = onnx.__version__
        out["onnxscript"] = onnxscript.__version__
    except ImportError as e:  # pragma: no cover
        out["onnx"] = f"missing ({e})"
    out["bridge"] = _bridge_state()
    out["kernel_list"] = _kernel_list_state()
    return out


def _kernel_list_state() -> dict[str, Any]:
    """How the support table learns which ops ORT runs: ORT's kernel list (read in this process,
    or in a child where the build has provider libraries), or, when it cannot be read, sessions
    created per probed op."""
    import collections
    import os

    from .runtime import _ort

    libraries = [os.path.basename(p) for p in _ort.provider_libraries()]
    state: dict[str, Any] = {"provider_libraries": libraries, "read": "child process" if libraries else "in process"}
    try:
        defs = _ort.kernel_defs()
    except _ort.KernelDefsUnavailableError as e:
        state["read"] = f"unavailable ({e}); sessions decide per probed op"
        return state
    state["kernels"] = dict(sorted(collections.Counter(d.provider for d in defs).items()))
    return state


def _bridge_state() -> dict[str, Any]:
    build = Path(__file__).with_name("_bridge_build.json")
    state: dict[str, Any] = {"built": build.exists()}
    if build.exists():
        try:
            state.update(json.loads(build.read_text()))
        except (OSError, ValueError) as e:
            state["error"] = f"unreadable build record: {e}"
    return state


def _bridge_available() -> bool:
    if not _bridge_state()["built"]:
        return False
    try:
        importlib.import_module("ort_lazy._bridge")
        return True
    except ImportError:
        return False


def _time(fn: Callable[[], Any], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _max_err(a: Any, b: Any) -> float:
    import torch

    a = a[0] if isinstance(a, (tuple, list)) else a
    b = b[0] if isinstance(b, (tuple, list)) else b
    a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    return float((a - b).abs().max()) if a.numel() else 0.0


def _dynamo_row(name: str, model: Any, inputs: tuple[Any, ...], reps: int) -> dict[str, Any]:
    import torch

    from . import metrics

    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="ort")
    start = time.perf_counter()
    out = compiled(*inputs)
    first = time.perf_counter() - start
    return {"out": out, "first_s": first, "call_s": _time(lambda: compiled(*inputs), reps), "counters": metrics.counters()}


def _fx_row(name: str, model: Any, inputs: tuple[Any, ...], reps: int) -> dict[str, Any]:
    import torch

    from . import fx, metrics

    torch._dynamo.reset()
    metrics.reset()
    start = time.perf_counter()
    compiled = fx.compile(copy.deepcopy(model), list(inputs))
    out = compiled(*inputs)
    first = time.perf_counter() - start
    return {"out": out, "first_s": first, "call_s": _time(lambda: compiled(*inputs), reps), "counters": metrics.counters()}


def _jit_row(name: str, model: Any, inputs: tuple[Any, ...], reps: int) -> dict[str, Any]:
    import torch

    from . import jit, metrics

    metrics.reset()
    start = time.perf_counter()
    scripted = torch.jit.trace(copy.deepcopy(model), inputs, check_trace=False)
    with jit.enable():
        # TorchScript's profiling executor runs the first call(s) as they are and fuses the
        # ORT groups after: the first call that matters is the one ORT first runs in
        out, calls = _until_ort_runs(lambda: scripted(*inputs))
        first = time.perf_counter() - start
        call = _time(lambda: scripted(*inputs), reps)
    return {"out": out, "first_s": first, "first_calls": calls, "call_s": call, "counters": metrics.counters()}


def _until_ort_runs(call: Callable[[], Any], limit: int = 5) -> tuple[Any, int]:
    """Call until ORT has run (at most ``limit`` calls); the last output and the calls made."""
    from . import metrics

    calls = 0
    while True:
        out = call()
        calls += 1
        if calls >= limit or metrics.counters()["ort_runs"] > 0:
            return out, calls


def _lazy_row(name: str, model: Any, inputs: tuple[Any, ...], reps: int) -> dict[str, Any]:
    import torch
    import torch._lazy

    from . import lazy, metrics

    lazy.init()
    metrics.reset()
    device = torch.device("lazy")
    m = copy.deepcopy(model).to(device)
    lazy_inputs = tuple(t.to(device) for t in inputs)

    def step() -> Any:
        out = m(*lazy_inputs)
        torch._lazy.mark_step()
        torch._lazy.wait_device_ops()  # mark_step only starts the step: time it to its end
        return out

    start = time.perf_counter()
    out, calls = _until_ort_runs(step)  # as for jit: TorchScript runs the step's graph first
    first = time.perf_counter() - start
    call = _time(step, reps)
    return {"out": out.to("cpu"), "first_s": first, "first_calls": calls, "call_s": call, "counters": metrics.counters()}


_DOORS: dict[str, Callable[..., dict[str, Any]]] = {
    "dynamo": _dynamo_row,
    "fx": _fx_row,
    "jit": _jit_row,
    "lazy": _lazy_row,
}
_BRIDGE_DOORS = {"jit", "lazy"}
# The bridge front doors are exercised on models whose graphs TorchScript keeps whole.
_BRIDGE_MODELS = {"seed", "mlp"}


def demo(models: Sequence[str] | None = None, doors: Sequence[str] | None = None, reps: int = 20, out: Any = None) -> list[dict[str, Any]]:
    """Run the built-in models through every available front door; print a parity/timing table."""
    import torch

    from .models import BUILTIN, get

    out = out or sys.stdout
    names = list(models or BUILTIN)
    doors = list(doors or _DOORS)
    bridge = _bridge_available()
    rows: list[dict[str, Any]] = []
    torch.manual_seed(0)
    for name in names:
        spec = get(name)
        model = spec.make().eval()
        inputs = spec.inputs()
        with torch.no_grad():
            expected = model(*inputs)
            eager = _time(lambda m=model, i=inputs: m(*i), reps)
            for door in doors:
                row: dict[str, Any] = {"model": name, "door": door, "eager_ms": eager * 1e3}
                if door in _BRIDGE_DOORS and (not bridge or name not in _BRIDGE_MODELS):
                    if not bridge:
                        row["status"] = "bridge not built"
                        row["note"] = "build it: python build.py --enable_lazy_tensor"
                    else:
                        row["status"] = "n/a"
                        row["note"] = f"the {door} demo runs only {', '.join(sorted(_BRIDGE_MODELS))} (graphs TorchScript keeps whole)"
                    rows.append(row)
                    continue
                try:
                    result = _DOORS[door](name, model, inputs, reps)
                except Exception as e:  # a failing door is reported, the demo goes on
                    row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
                    rows.append(row)
                    continue
                err = _max_err(result["out"], expected)
                counters = result["counters"]
                row.update(
                    {
                        "status": "ok" if err <= 1e-3 * max(1.0, _max_err(expected, torch.zeros_like(expected))) else "MISMATCH",
                        "max_abs_err": err,
                        "ort_ms": result["call_s"] * 1e3,
                        "first_call_s": result["first_s"],
                        "first_calls": result.get("first_calls", 1),
                        "ratio_vs_eager": result["call_s"] / eager if eager else float("nan"),
                        "ort_runs": counters["ort_runs"],
                        "fallback_ops": counters["fallback_ops"],
                    }
                )
                if counters["ort_runs"] == 0:
                    row["status"] = "ORT did not run"
                    row["note"] = "every op fell back: see ort-lazy explain " + name
                rows.append(row)
    _print_table(rows, out, reps)
    return rows


#: What each column of the demo table means.
LEGEND = (
    "status      ok: the output matches eager PyTorch (max err <= 1e-3 x its largest value); MISMATCH: it does not;\n"
    "            ORT did not run: every op stayed in PyTorch; n/a / bridge not built: not run (reason shown)",
    "max err     largest absolute difference from eager PyTorch's output",
    "eager ms    median time of one call in eager PyTorch ({reps} timed calls after warm-up)",
    "ort ms      median time of one call through the front door, supported parts on ORT",
    "ratio       ort ms / eager ms: below 1.00x is faster than eager",
    "1st call s  the first call, compiling included; jit and lazy: the calls until ORT first ran, shown as\n"
    "            (n) (TorchScript's executor runs a graph as it is before it fuses ORT groups into it)",
    "ort runs    ORT session runs over every call of the row",
)


def _print_table(rows: list[dict[str, Any]], out: Any, reps: int = 20) -> None:
    header = f"{'model':<12}{'door':<8}{'status':<18}{'max err':>10}{'eager ms':>10}{'ort ms':>10}{'ratio':>8}{'1st call s':>13}{'ort runs':>9}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        if "ort_ms" not in r:
            print(f"{r['model']:<12}{r['door']:<8}{r['status']:<18}{r.get('note', '')}", file=out)
            continue
        calls = r.get("first_calls", 1)
        # 3 significant digits: a small graph's first calls take milliseconds, not "0.00" s
        first = f"{r['first_call_s']:.3g}" + (f" ({calls})" if calls > 1 else "")
        print(
            f"{r['model']:<12}{r['door']:<8}{r['status']:<18}{r['max_abs_err']:>10.2e}{r['eager_ms']:>10.3f}"
            f"{r['ort_ms']:>10.3f}{r['ratio_vs_eager']:>7.2f}x{first:>13}{r['ort_runs']:>9}",
            file=out,
        )
        if r.get("note"):
            print(f"{'':<20}{r['note']}", file=out)
    print("", file=out)
    for line in LEGEND:
        print(line.format(reps=reps), file=out)


def _import_target(module_name: str) -> Any:
    """The module ``module_name`` names: a dotted module found from the working directory or
    ``sys.path``, or a ``.py`` file (relative to the working directory or absolute)."""
    import importlib.util

    looks_like_file = module_name.endswith(".py") or "/" in module_name or "\\" in module_name
    if looks_like_file:
        path = Path(module_name).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
        if not path.is_file():
            raise SystemExit(f"ort-lazy explain: no such file: {path}")
        folder = str(path.parent.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)  # the file's own imports of its neighbours work
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"ort-lazy explain: cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        return module
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module written since the interpreter started is found too
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name) and (module_name == e.name or module_name[len(e.name)] == "."):
            raise SystemExit(
                f"ort-lazy explain: no module named {module_name!r} in the working directory ({cwd}) or on sys.path; "
                "give a dotted module name or a path to a .py file, e.g. models/my_model.py:make"
            ) from None
        raise  # the user's module itself failed to import something


def _load_factory(target: str) -> tuple[Any, tuple[Any, ...]]:
    """``module:attribute`` naming a factory returning ``(model, example_inputs)``."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise SystemExit(f"ort-lazy explain: expected a built-in model name or module:attribute, got {target!r}")
    obj = _import_target(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"ort-lazy explain: {module_name} has no attribute {attr!r}") from None
    made = obj() if callable(obj) and not hasattr(obj, "forward") else obj
    if isinstance(made, tuple) and len(made) == 2:
        model, inputs = made
        return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    raise SystemExit(f"ort-lazy explain: {target} must return (model, example_inputs), got {type(made).__name__}")


def _cmd_explain(args: argparse.Namespace) -> int:
    import difflib

    from .frontends.explain import explain
    from .models import BUILTIN, get

    if args.model in BUILTIN:
        spec = get(args.model)
        model, inputs = spec.make(), spec.inputs()
        if not args.train:
            model.eval()
    elif ":" not in args.model:
        close = difflib.get_close_matches(args.model, list(BUILTIN), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise SystemExit(
            f"ort-lazy explain: unknown built-in model {args.model!r}; {hint}built-in: {', '.join(BUILTIN)}; "
            "or give module:factory (a factory returning (model, example_inputs))"
        )
    else:
        model, inputs = _load_factory(args.model)
    report = explain(model, *inputs, backward=args.train)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report)
    return 0


def _save_factory(target: str) -> tuple[Any, Any, Any]:
    """``module:factory`` for ``ort-lazy save``: the factory returns ``(model, example_inputs)``
    or ``(model, example_inputs, dynamic_shapes)``; ``example_inputs`` a tuple of positional
    inputs, a dict of keyword inputs, or one tensor; ``dynamic_shapes`` as ``torch.export``
    takes it."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise SystemExit(f"ort-lazy save: expected module:factory (or path/to/file.py:factory), got {target!r}")
    obj = _import_target(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"ort-lazy save: {module_name} has no attribute {attr!r}") from None
    made = obj() if callable(obj) and not hasattr(obj, "forward") else obj
    if isinstance(made, tuple) and len(made) in (2, 3):
        return made[0], made[1], made[2] if len(made) == 3 else None
    raise SystemExit(
        f"ort-lazy save: {target} must return (model, example_inputs) or (model, example_inputs, dynamic_shapes), "
        f"got {type(made).__name__}"
    )


def _cmd_save(args: argparse.Namespace) -> int:
    from .frontends.save import export_onnx, save

    options: dict[str, Any] = {}
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"ort-lazy save: --option takes name=value, got {item!r}")
        options[name.strip()] = value
    model, inputs, dynamic = _save_factory(args.model)
    if args.onnx:
        result = export_onnx(model, inputs, args.out, dynamic_shapes=dynamic, **options)
    else:
        result = save(model, inputs, args.out, dynamic_shapes=dynamic, program=args.program, **options)
    print(json.dumps(result, indent=2, default=str))
    return 0


def _print_artifact(path: str, as_json: bool) -> int:
    from .runtime.artifact_format import ArtifactError, summary

    try:
        data = summary(path)
    except ArtifactError as e:
        print(f"ort-lazy info: {e}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    for key in ("path", "size", "runs", "program", "providers", "inputs", "versions", "weights", "ops_in_pytorch"):
        print(f"{key:<16}{data[key]}")
    for region in data["regions"]:
        print(f"region {region['id']}: opsets {region['opsets']}, IR {region['ir_version']}, {region['initializers']} weights bound")
        print(f"  inputs   {', '.join(region['inputs'])}")
        print(f"  outputs  {', '.join(region['outputs'])}")
        print(f"  ops      {', '.join(region['ops'])}")
    return 0


def _cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    if not (root / "bench.py").exists():
        print(f"ort-lazy bench: the benchmark suite lives in the source tree ({root}); not found", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    bench = importlib.import_module("bench")
    return int(bench.main(rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ort-lazy`` command."""
    parser = argparse.ArgumentParser(prog="ort-lazy", description="ONNX Runtime backend for PyTorch compilers")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="versions, ORT flavour and providers, bridge, CUDA; or what a saved artifact holds")
    p_info.add_argument("artifact", nargs="?", default=None, help="an artifact ort-lazy save wrote: its regions, ops and versions")
    p_info.add_argument("--json", action="store_true")
    p_demo = sub.add_parser("demo", help="built-in models through every front door: parity and timing")
    p_demo.add_argument("--models", default=None, help="comma-separated built-in models (default: all)")
    p_demo.add_argument("--doors", default=None, help="comma-separated front doors: dynamo,fx,jit,lazy")
    p_demo.add_argument("--reps", type=int, default=20)
    p_demo.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p_explain = sub.add_parser("explain", help="what runs on ORT and why the rest does not")
    p_explain.add_argument(
        "model", help="a built-in model name, or module:factory / path/to/file.py:factory returning (model, inputs)"
    )
    p_explain.add_argument("--train", action="store_true", help="also compile and explain the backward graph")
    p_explain.add_argument("--json", action="store_true")
    p_save = sub.add_parser("save", help="save a model as ort-lazy runs it (one artifact, or --onnx one ONNX file)")
    p_save.add_argument(
        "model", help="module:factory / path/to/file.py:factory returning (model, example_inputs[, dynamic_shapes])"
    )
    p_save.add_argument("out", help="the artifact (or ONNX file) to write")
    p_save.add_argument("--onnx", action="store_true", help="one ONNX file (every op must run on ORT)")
    p_save.add_argument("--program", action="store_true", help="also keep the torch.export program in the artifact")
    p_save.add_argument("--option", action="append", default=[], help="an ort-lazy option as name=value (repeatable)")
    sub.add_parser("bench", help="the benchmark suite (arguments are passed on)", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _cmd_bench(parser.parse_args(argv[:1]), argv[1:])
    args = parser.parse_args(argv)
    if args.command == "info" and args.artifact:
        return _print_artifact(args.artifact, args.json)
    if args.command == "save":
        return _cmd_save(args)
    if args.command == "info":
        data = info()
        if "torch_warning" in data:  # on stderr: stdout stays the report (JSON with --json)
            print(f"warning: {data['torch_warning']}", file=sys.stderr)
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            for key, value in data.items():
                print(f"{key:<22}{value}")
        return 0
    if args.command == "demo":
        rows = demo(
            args.models.split(",") if args.models else None,
            args.doors.split(",") if args.doors else None,
            reps=args.reps,
        )
        if args.json:
            Path(args.json).write_text(json.dumps([{k: v for k, v in r.items()} for r in rows], indent=2, default=str))
        bad = [r for r in rows if r["status"] not in ("ok", "bridge not built", "n/a")]
        return 1 if bad else 0
    if args.command == "explain":
        return _cmd_explain(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

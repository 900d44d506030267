"""The ``ort-lazy`` command: ``info``, ``demo``, ``explain`` and ``bench``."""

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
    """Versions, ORT flavour and providers, bridge state and CUDA availability."""
    import torch

    from ._version import __version__
    from .runtime import flavour

    ort = flavour.onnxruntime()
    out: dict[str, Any] = {
        "ort_lazy": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
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
    return out


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
    scripted = torch.jit.trace(copy.deepcopy(model), inputs, check_trace=False)
    with jit.enable():
        start = time.perf_counter()
        out = scripted(*inputs)
        first = time.perf_counter() - start
        call = _time(lambda: scripted(*inputs), reps)
    return {"out": out, "first_s": first, "call_s": call, "counters": metrics.counters()}


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
        return out

    start = time.perf_counter()
    out = step()
    first = time.perf_counter() - start
    call = _time(step, reps)
    return {"out": out.to("cpu"), "first_s": first, "call_s": call, "counters": metrics.counters()}


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
                    row["status"] = "bridge not built" if not bridge else "n/a"
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
                        "ratio_vs_eager": result["call_s"] / eager if eager else float("nan"),
                        "ort_runs": counters["ort_runs"],
                        "fallback_ops": counters["fallback_ops"],
                    }
                )
                if counters["ort_runs"] == 0:
                    row["status"] = "ORT did not run"
                rows.append(row)
    _print_table(rows, out)
    return rows


def _print_table(rows: list[dict[str, Any]], out: Any) -> None:
    header = f"{'model':<12}{'door':<8}{'status':<18}{'max err':>10}{'eager ms':>10}{'ort ms':>10}{'ratio':>8}{'1st call s':>11}{'ort runs':>9}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        if "ort_ms" not in r:
            print(f"{r['model']:<12}{r['door']:<8}{r['status']:<18}", file=out)
            continue
        print(
            f"{r['model']:<12}{r['door']:<8}{r['status']:<18}{r['max_abs_err']:>10.2e}{r['eager_ms']:>10.3f}"
            f"{r['ort_ms']:>10.3f}{r['ratio_vs_eager']:>7.2f}x{r['first_call_s']:>11.2f}{r['ort_runs']:>9}",
            file=out,
        )


def _load_factory(target: str) -> tuple[Any, tuple[Any, ...]]:
    """``module:attribute`` naming a factory returning ``model`` or ``(model, example_inputs)``."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise SystemExit(f"ort-lazy explain: expected a built-in model name or module:attribute, got {target!r}")
    sys.path.insert(0, str(Path.cwd()))
    obj = getattr(importlib.import_module(module_name), attr)
    made = obj() if callable(obj) and not hasattr(obj, "forward") else obj
    if isinstance(made, tuple) and len(made) == 2:
        model, inputs = made
        return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    raise SystemExit(f"ort-lazy explain: {target} must return (model, example_inputs)")


def _cmd_explain(args: argparse.Namespace) -> int:
    from .frontends.explain import explain
    from .models import BUILTIN, get

    if args.model in BUILTIN:
        spec = get(args.model)
        model, inputs = spec.make(), spec.inputs()
        if not args.train:
            model.eval()
    else:
        model, inputs = _load_factory(args.model)
    report = explain(model, *inputs, backward=args.train)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report)
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
    p_info = sub.add_parser("info", help="versions, ORT flavour and providers, bridge, CUDA")
    p_info.add_argument("--json", action="store_true")
    p_demo = sub.add_parser("demo", help="built-in models through every front door: parity and timing")
    p_demo.add_argument("--models", default=None, help="comma-separated built-in models (default: all)")
    p_demo.add_argument("--doors", default=None, help="comma-separated front doors: dynamo,fx,jit,lazy")
    p_demo.add_argument("--reps", type=int, default=20)
    p_demo.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p_explain = sub.add_parser("explain", help="what runs on ORT and why the rest does not")
    p_explain.add_argument("model", help="a built-in model name or module:attribute returning (model, inputs)")
    p_explain.add_argument("--train", action="store_true", help="also compile and explain the backward graph")
    p_explain.add_argument("--json", action="store_true")
    sub.add_parser("bench", help="the benchmark suite (arguments are passed on)", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _cmd_bench(parser.parse_args(argv[:1]), argv[1:])
    args = parser.parse_args(argv)
    if args.command == "info":
        data = info()
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

#!/usr/bin/env python3
"""Per-step time of LazyTensor and TorchScript, each with and without ORT, in one process.

Rows:

* ``lazy seed``: the seed model (x*x, +x, *x, -x, /x) on ``device="lazy"``, one step =
  trace + ``mark_step`` + wait; plain TorchScript executor vs ORT.
* ``lazy mlp``: an MLP forward + backward + SGD step on ``device="lazy"``.
* ``jit seed``: the seed model as a ``torch.jit.script`` function, no grad.
* ``jit mlp``: a scripted MLP, forward + backward (the executor's differentiable graph).

Plain runs come first; switching ORT on drops LazyTensor's compiled graphs and uses fresh
scripted functions, so every row is measured on its own compiled graph.

Usage::

    python benchmarks/bench_lazy_jit.py [--steps 300] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._lazy as ltm
import torch._lazy.ts_backend

import ort_lazy
from ort_lazy import metrics


def seed_model(x: torch.Tensor) -> torch.Tensor:
    y = x * x
    z = y + x
    p = z * x
    q = p - x
    return q / x


def make_mlp(features: int, hidden: int, classes: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    )


def time_steps(step: Callable[[], Any], steps: int, warmup: int) -> float:
    """Median per-step time in microseconds."""
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def lazy_rows(args: argparse.Namespace, ltm: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    x_seed = torch.tensor([-1.0, 1.0, 2.0, 3.0], device="lazy")
    keep: list[torch.Tensor] = []

    def seed_step() -> None:
        # the result must stay alive across mark_step, or there is nothing to execute
        keep[:] = [seed_model(x_seed)]
        ltm.mark_step()
        ltm.wait_device_ops()

    net = make_mlp(args.features, args.hidden, args.classes).to("lazy")
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.features).to("lazy")
    target = torch.randint(0, args.classes, (args.batch,)).to("lazy")
    ltm.mark_step()

    def mlp_step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), target)
        loss.backward()
        opt.step()
        ltm.mark_step()
        ltm.wait_device_ops()

    return seed_step, mlp_step


def jit_rows(args: argparse.Namespace) -> tuple[Callable[[], Any], Callable[[], Any]]:
    # a new function object each time: torch.jit.script caches per function
    def seed(x: torch.Tensor) -> torch.Tensor:
        y = x * x
        z = y + x
        p = z * x
        q = p - x
        return q / x

    fn = torch.jit.script(seed)
    x_seed = torch.tensor([-1.0, 1.0, 2.0, 3.0])

    def seed_step() -> None:
        with torch.no_grad():
            fn(x_seed)

    # a new module class too: scripted instances of one class share their compiled forward
    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = make_mlp(args.features, args.hidden, args.classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers(x)

    net = torch.jit.script(MLP())
    x = torch.randn(args.batch, args.features)
    target = torch.randint(0, args.classes, (args.batch,))

    def mlp_step() -> None:
        net.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), target)
        loss.backward()

    return seed_step, mlp_step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps per row (profiling, export)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch and ORT intra-op threads (default: torch's)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, int]] = {}
    fallbacks: dict[str, dict[str, int]] = {}
    ort_options: dict[str, Any] = {}  # ORT follows torch's thread count itself

    def measure(row: str, column: str, step: Callable[[], Any]) -> None:
        metrics.reset()
        results.setdefault(row, {})[column] = time_steps(step, args.steps, args.warmup)
        c = metrics.counters()
        counts.setdefault(row, {})[column] = c["ort_runs"]
        fallbacks.setdefault(row, {})[column] = c["torch_runs"]

    # plain TorchScript first (the bridge pass is off)
    seed_step, mlp_step = jit_rows(args)
    measure("jit seed", "plain", seed_step)
    measure("jit mlp fwd+bwd", "plain", mlp_step)
    torch._lazy.ts_backend.init()
    seed_step, mlp_step = lazy_rows(args, ltm)
    measure("lazy seed", "plain", seed_step)
    measure("lazy mlp fwd+bwd+sgd", "plain", mlp_step)

    ort_lazy.lazy.init(**ort_options)
    seed_step, mlp_step = lazy_rows(args, ltm)
    measure("lazy seed", "ort", seed_step)
    measure("lazy mlp fwd+bwd+sgd", "ort", mlp_step)
    ort_lazy.lazy.shutdown()

    with ort_lazy.jit.enable(**ort_options):
        seed_step, mlp_step = jit_rows(args)
        measure("jit seed", "ort", seed_step)
        measure("jit mlp fwd+bwd", "ort", mlp_step)

    print(f"per-step time, median of {args.steps} steps (us); torch threads {torch.get_num_threads()}")
    print(f"{'benchmark':<24}{'plain':>12}{'ORT':>12}{'ORT/plain':>12}{'ort_runs':>10}{'ts_runs':>9}")
    for row, cols in results.items():
        ratio = cols["ort"] / cols["plain"]
        print(f"{row:<24}{cols['plain']:>12.1f}{cols['ort']:>12.1f}{ratio:>12.2f}{counts[row]['ort']:>10}{fallbacks[row]['ort']:>9}")
    missing = [row for row, c in counts.items() if c["ort"] == 0]
    if missing:
        print(f"warning: ORT did not run for {missing}", file=sys.stderr)
    if args.json:
        payload = {
            "unit": "us/step (median)",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "args": vars(args),
            "results": results,
            "ort_runs": counts,
            "torch_runs": fallbacks,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

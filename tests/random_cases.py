"""Seeded random combinations of options, input devices, dtypes, functions and front doors.

``python random_cases.py SEED FIRST COUNT`` runs cases FIRST .. FIRST+COUNT-1 of the sequence
SEED draws, one after another in this process, and prints ``CASE i <description>`` before and
``DONE i <verdict>`` after each, then ``SUMMARY <json>``. A verdict is ``ok`` (the result equals
eager's, or eager raises and so does the compiled model, or the options were invalid and the
error names the setting) or ``FAIL <why>``. A crash shows as a ``CASE`` line without its
``DONE``: the parent test names that case.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
DEVICES = ("cpu", "meta")
#: fx_cpu: compiled for a CPU example, called with the case's input (another device or none)
DOORS = ("dynamo", "compile", "fx", "fx_cpu")


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2


def _factory(x: torch.Tensor) -> torch.Tensor:
    return x + torch.ones(x.shape, dtype=x.dtype, device=x.device)


def _break(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    torch._dynamo.graph_break()
    return y + x


#: name -> (function or module factory, whether it is an nn.Module factory)
FUNCTIONS: dict[str, tuple[Callable[..., Any], bool]] = {
    "elementwise": (lambda x: torch.sin(x) * 2 + x, False),
    "reduce": (lambda x: (x * x + x).sum(-1), False),
    "relu_abs": (lambda x: torch.relu(x) - x.abs(), False),
    "where_cumsum": (lambda x: torch.where(x > 0, x, torch.zeros_like(x)).cumsum(0), False),
    "views": (lambda x: x.t().contiguous().reshape(-1)[::2] * 3, False),
    "factory": (_factory, False),
    "graph_break": (_break, False),
    "linear": (Linear, True),
}

#: option name -> values drawn from (valid ones, and a few invalid ones the error must name)
OPTION_VALUES: dict[str, list[Any]] = {
    "min_block_size": [1, 1, 2, 3, 100, 0],
    "torch_executed_ops": ["", "aten.mul", "aten.add.Tensor,aten::sin", "aten.mull"],
    "run_type": ["ort", "ort", "pytorch", "debug", "fastest"],
    "dynamic": [True, False],
    "freeze_weights": [False, True],
    "allow_spinning": [None, True, False],
    "cache_size": [64, 1],
    "providers": [None, "cpu", "cuda"],
    "session_options": [{}, {"intra_op_num_threads": 1}, {"graph_optimization_level": "ORT_ENABLE_BASIC"}, {"intra_op_num_thread": 1}],
    "autotune": [False, False, False, True],
}
#: the names an error must mention for each invalid value above
INVALID = {
    ("min_block_size", 0): "min_block_size",
    ("torch_executed_ops", "aten.mull"): "aten.mul",
    ("run_type", "fastest"): "run_type",
    ("session_options", "intra_op_num_thread"): "intra_op_num_threads",
}


@dataclass
class Case:
    index: int
    function: str
    door: str
    dtype: torch.dtype
    device: str
    shape: tuple[int, ...]
    grad: bool
    options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        opts = ",".join(f"{k}={v!r}" for k, v in sorted(self.options.items()))
        return (
            f"{self.function} door={self.door} dtype={str(self.dtype).removeprefix('torch.')} device={self.device} "
            f"shape={self.shape} grad={self.grad} options={{{opts}}}"
        )


def draw(seed: int, count: int) -> list[Case]:
    """The first ``count`` cases of the sequence ``seed`` draws."""
    rng = random.Random(seed)
    cases = []
    for index in range(count):
        options = {}
        for name in rng.sample(sorted(OPTION_VALUES), k=rng.randint(0, 3)):
            options[name] = rng.choice(OPTION_VALUES[name])
        options = {k: v for k, v in options.items() if v is not None and v != ""}
        dtype = rng.choice(DTYPES)
        device = rng.choice(DEVICES)
        cases.append(
            Case(
                index=index,
                function=rng.choice(sorted(FUNCTIONS)),
                door=rng.choice(DOORS),
                dtype=dtype,
                device=device,
                shape=rng.choice([(4, 4), (3, 4), (1, 4), (0, 4)]),
                grad=dtype.is_floating_point and device == "cpu" and rng.random() < 0.3,
                options=options,
            )
        )
    return cases


def _invalid(options: dict[str, Any]) -> list[str]:
    """What an error may name when ``options`` hold invalid values (one word per invalid
    value; empty when all are valid)."""
    words = []
    for (name, value), word in INVALID.items():
        given = options.get(name)
        if given == value or (isinstance(given, dict) and value in given):
            words.append(word)
    if options.get("providers") == "cuda":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            words.append("CUDAExecutionProvider")
    return words


def _input(case: Case, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if case.dtype == torch.bool:
        x = torch.rand(case.shape, generator=gen) > 0.5
    elif case.dtype.is_floating_point:
        x = torch.randn(case.shape, generator=gen).to(case.dtype)
    else:
        x = torch.randint(-5, 6, case.shape, generator=gen).to(case.dtype)
    x = x.to(case.device)
    return x.requires_grad_() if case.grad else x


class _Wrap(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(x)


def _make(case: Case) -> Any:
    fn, is_module = FUNCTIONS[case.function]
    if not is_module:
        return fn
    torch.manual_seed(case.index)
    module = fn()
    if case.dtype.is_floating_point:
        module = module.to(case.dtype)
    return module.to(case.device)


def _compile(case: Case, model: Any, example: torch.Tensor) -> Callable[..., Any]:
    import ort_lazy
    import ort_lazy.fx

    torch._dynamo.reset()
    if case.door == "dynamo":
        compiled = torch.compile(model, backend="ort", options=dict(case.options))
    elif case.door == "compile":
        compiled = ort_lazy.compile(model, **case.options)
    else:
        module = model if isinstance(model, torch.nn.Module) else _Wrap(model)
        if case.door == "fx_cpu":
            example = torch.zeros(example.shape, dtype=example.dtype).requires_grad_(example.requires_grad)
        compiled = ort_lazy.fx.compile(module, [example], **case.options)
    return compiled


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-2, 2e-2
    if dtype == torch.float32:
        return 1e-4, 1e-4
    return 1e-7, 1e-7


def _same(actual: Any, expected: Any, dtype: torch.dtype) -> str | None:
    """None when ``actual`` equals ``expected`` (eager's), else what differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"expected a tensor, got {type(actual).__name__}"
        if actual.device != expected.device or actual.dtype != expected.dtype or actual.shape != expected.shape:
            return f"got {actual.device}/{actual.dtype}/{tuple(actual.shape)}, eager {expected.device}/{expected.dtype}/{tuple(expected.shape)}"
        if expected.device.type == "meta":
            return None
        rtol, atol = _tolerance(dtype)
        scale = float(expected.detach().abs().max()) if expected.numel() and expected.dtype.is_floating_point else 1.0
        try:
            torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)
        except AssertionError as e:
            return str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:3])
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"expected {len(expected)} outputs"
        for a, e in zip(actual, expected):
            problem = _same(a, e, dtype)
            if problem:
                return problem
        return None
    return None if actual == expected else f"{actual!r} != {expected!r}"


def run_case(case: Case) -> str:
    """``ok`` or ``FAIL <why>`` for one case."""
    from ort_lazy import OptionsError, metrics

    metrics.reset()
    invalid = _invalid(case.options)
    model = _make(case)
    x = _input(case, case.index)
    x_eager = x.detach().clone().requires_grad_(case.grad)
    try:
        expected = model(x_eager)
        expected_error = None
    except Exception as e:
        expected, expected_error = None, e
    eager_grad = None
    if expected_error is None and case.grad:
        torch.utils._pytree.tree_leaves(expected)[0].float().sum().backward()
        eager_grad = x_eager.grad
    try:
        compiled = _compile(case, model, x)
        actual = compiled(x)
    except OptionsError as e:
        if any(word in str(e) for word in invalid):
            return "ok"
        return f"FAIL OptionsError not naming any of {invalid!r}: {e}"
    except Exception as e:
        if any(word in str(e) for word in invalid):
            return "ok"  # the invalid setting, named through the front door's wrapping
        if expected_error is not None:
            return "ok"  # eager raises too
        return f"FAIL raised {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    if invalid:
        return f"FAIL invalid options accepted (should name {invalid!r})"
    if expected_error is not None:
        return f"FAIL eager raised {type(expected_error).__name__} but the compiled model returned"
    problem = _same(actual, expected, case.dtype)
    if problem:
        return f"FAIL differs from eager: {problem}"
    if case.grad:
        out = torch.utils._pytree.tree_leaves(actual)[0]
        out.float().sum().backward()
        problem = _same(x.grad, eager_grad, case.dtype)
        if problem:
            return f"FAIL gradient differs from eager: {problem}"
    return "ok"


def main(argv: list[str]) -> int:
    seed, first, count = (int(a) for a in argv[:3])
    import logging

    logging.getLogger("ort_lazy").setLevel(logging.ERROR)  # warnings are expected here
    start = time.perf_counter()
    results: dict[str, Any] = {"ok": 0, "fail": 0, "ort_ran": 0}
    for case in draw(seed, first + count)[first:]:
        print(f"CASE {case.index} {case.describe()}", flush=True)
        try:
            verdict = run_case(case)
        except Exception:  # a bug of this harness or an unexpected error type: report it
            verdict = "FAIL harness: " + traceback.format_exc().replace("\n", " | ")[-600:]
        results["ok" if verdict == "ok" else "fail"] += 1
        from ort_lazy import metrics

        results["ort_ran"] += metrics.counters()["ort_runs"] > 0
        print(f"DONE {case.index} {verdict}", flush=True)
    results["seconds"] = round(time.perf_counter() - start, 1)
    print("SUMMARY " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""ORT's CPU kernels against PyTorch's, one operation at a time, at the shapes of the suite's steps.

A training step on ORT cannot be faster than ORT's kernels for its operations. This script
times the matrix products of the suite's training steps (the feed-forward block, ViT-Tiny, the
MLP, BERT's layers; forward products, input gradients and the weight gradients ``x^T @ dy``)
and two elementwise kernels, each alone: ORT on a one-node model with inputs and outputs bound
once (IOBinding), against the PyTorch call that computes the same values into a preallocated
output, on one thread and on ``--threads``. Blocks of calls of each side alternate in rounds (a
pause before each, so neither side starts beside the other's spinning threads), so drift in the
machine's load hits both alike; each row reports the median block.

Run ``python benchmarks/kernels.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One operation: an ONNX node over float32 inputs of these shapes, and PyTorch's form."""

    name: str
    op: str  # MatMul, FusedMatMul (transA), Add, Mul
    shapes: tuple[tuple[int, ...], ...]

    def torch_call(self, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> Callable[[], Any]:
        a, b = inputs
        if self.op == "FusedMatMul":
            at = a.t()
            return lambda: torch.mm(at, b, out=out)
        if self.op == "MatMul":
            return lambda: torch.mm(a, b, out=out)
        fn = {"Add": torch.add, "Mul": torch.mul}[self.op]
        return lambda: fn(a, b, out=out)

    def output_shape(self) -> tuple[int, ...]:
        a, b = self.shapes
        if self.op == "FusedMatMul":
            return (a[1], b[1])
        if self.op == "MatMul":
            return (a[0], b[1])
        return a

    def onnx_model(self) -> bytes:
        from onnx import TensorProto, helper

        attrs = {"domain": "com.microsoft", "transA": 1} if self.op == "FusedMatMul" else {}
        node = helper.make_node(self.op, ["a", "b"], ["y"], **attrs)
        graph = helper.make_graph(
            [node], self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip("ab", self.shapes)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(self.output_shape()))],
        )
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets).SerializeToString()


#: the operations of the suite's training steps (tokens x features; ``^T``: the weight gradient)
KERNELS: tuple[Kernel, ...] = (
    Kernel("ffn x@W1 [256,1024]@[1024,4096]", "MatMul", ((256, 1024), (1024, 4096))),
    Kernel("ffn dx [256,4096]@[4096,1024]", "MatMul", ((256, 4096), (4096, 1024))),
    Kernel("ffn dW2 [256,4096]^T@[256,1024]", "FusedMatMul", ((256, 4096), (256, 1024))),
    Kernel("ffn dW1 [256,1024]^T@[256,4096]", "FusedMatMul", ((256, 1024), (256, 4096))),
    Kernel("vit qkvo [394,192]@[192,192]", "MatMul", ((394, 192), (192, 192))),
    Kernel("vit dW qkvo [394,192]^T@[394,192]", "FusedMatMul", ((394, 192), (394, 192))),
    Kernel("vit fc1 [394,192]@[192,768]", "MatMul", ((394, 192), (192, 768))),
    Kernel("vit fc2 [394,768]@[768,192]", "MatMul", ((394, 768), (768, 192))),
    Kernel("vit dW fc2 [394,768]^T@[394,192]", "FusedMatMul", ((394, 768), (394, 192))),
    Kernel("bert ffn [256,256]@[256,1024]", "MatMul", ((256, 256), (256, 1024))),
    Kernel("bert dW ffn [256,256]^T@[256,1024]", "FusedMatMul", ((256, 256), (256, 1024))),
    Kernel("mlp [32,256]@[256,256]", "MatMul", ((32, 256), (256, 256))),
    Kernel("mlp dW [32,256]^T@[32,256]", "FusedMatMul", ((32, 256), (32, 256))),
    Kernel("add [256,4096]", "Add", ((256, 4096), (256, 4096))),
    Kernel("mul [394,768]", "Mul", ((394, 768), (394, 768))),
)

#: untimed pause before each block, so the other side's threads (OpenMP's spin after PyTorch's
#: calls) are idle when it starts
PAUSE_S = 0.05

#: ``--quick``: one small product and one elementwise kernel
QUICK = ("mlp [32,256]@[256,256]", "mul [394,768]")


@dataclasses.dataclass
class Result:
    """One kernel on one thread count: median microseconds per call of each side."""

    kernel: str
    threads: int
    ort_us: float
    torch_us: float
    max_abs_diff: float

    @property
    def ratio(self) -> float:
        """ORT's time over PyTorch's."""
        return self.ort_us / self.torch_us


def _ort_call(kernel: Kernel, inputs: Sequence[torch.Tensor], out: torch.Tensor, threads: int) -> Callable[[], Any]:
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    # the onnx package may write a newer IR version than the installed ORT reads (onnxruntime-openvino 1.24: 13)
    from ort_lazy.runtime.session_create import _clamp_ir_version

    sess = ort.InferenceSession(_clamp_ir_version(kernel.onnx_model()), sess_options=so, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    for name, t in zip("ab", inputs):
        binding.bind_input(name, "cpu", 0, np.float32, list(t.shape), t.data_ptr())
    binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.data_ptr())
    return lambda: sess.run_with_iobinding(binding)


def _time(call: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def measure(kernel: Kernel, threads: int, rounds: int, budget_s: float) -> Result:
    """Time ``kernel`` on ORT and in PyTorch on ``threads`` threads, blocks alternating."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        inputs = [torch.randn(s, generator=gen) for s in kernel.shapes]
        ort_out, torch_out = torch.empty(kernel.output_shape()), torch.empty(kernel.output_shape())
        sides = {"ort": _ort_call(kernel, inputs, ort_out, threads), "torch": kernel.torch_call(inputs, torch_out)}
        for call in sides.values():
            call()
        diff = float((ort_out.double() - torch_out.double()).abs().max())
        once = min(_time(call, 3) for call in sides.values())
        calls = max(3, int(budget_s * 1e6 / rounds / 2 / max(once, 1.0)))
        for call in sides.values():  # untimed: PyTorch's pool after a thread-count change, caches
            _time(call, calls)
        blocks: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(rounds):
            for side, call in sides.items():
                time.sleep(PAUSE_S)
                call()
                blocks[side].append(_time(call, calls))
        return Result(kernel.name, threads, statistics.median(blocks["ort"]), statistics.median(blocks["torch"]), diff)
    finally:
        torch.set_num_threads(previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print a table, optionally write JSON; 1 when ORT's and PyTorch's values differ."""
    p = argparse.ArgumentParser(prog="kernels.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="the second thread count (the first: 1)")
    p.add_argument("--rounds", type=int, default=7, help="blocks per side, alternating")
    p.add_argument("--budget", type=float, default=1.0, help="seconds of timed calls per kernel and thread count, about")
    p.add_argument("--quick", action="store_true", help="two kernels, 3 rounds, 0.1 s (smoke test)")
    p.add_argument("--json", dest="json_path", default="", help="write the results here")
    args = p.parse_args(argv)
    kernels = [k for k in KERNELS if not args.quick or k.name in QUICK]
    rounds, budget = (3, 0.1) if args.quick else (args.rounds, args.budget)
    counts = sorted({1, max(args.threads, 1)})
    results = [measure(k, t, rounds, budget) for k in kernels for t in counts]
    print(f"{'kernel':38} {'threads':>7} {'ORT us':>10} {'torch us':>10} {'ORT/torch':>9}")
    for r in results:
        print(f"{r.kernel:38} {r.threads:>7} {r.ort_us:>10.1f} {r.torch_us:>10.1f} {r.ratio:>8.2f}x")
    import onnxruntime

    meta = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "rounds": rounds, "budget_s": budget}
    print(f"torch {meta['torch']}  onnxruntime {meta['onnxruntime']}")
    if args.json_path:
        payload = {"meta": meta, "results": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in results]}
        Path(args.json_path).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    # the products sum in other orders: a few float32 roundings of |value| ~ sqrt(k) * 4
    wrong = [r for r in results if not r.max_abs_diff <= 1e-3]
    for r in wrong:
        print(f"ORT and PyTorch differ on {r.kernel}: {r.max_abs_diff:.3g}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())

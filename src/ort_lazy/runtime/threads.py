"""How many ORT intra-op threads a region gets, and how ORT and PyTorch share the CPU.

Waking a second ORT thread costs more than it saves on small regions (MLP 3x256, batch 32:
0.21 -> 0.17 ms per call on 2 cores; a scripted MLP forward+backward 1.88 -> 1.82 ms per step),
and it competes with the caller's Python and PyTorch work. So a region whose estimated work is
below :data:`SMALL_REGION_FLOPS` runs on one thread; others follow ``torch.get_num_threads()``
(applied by the runner to CPU sessions only). Re-measured on another 2-core machine (AMD EPYC,
ORT 1.32) with PyTorch's workers parked during multi-threaded runs (:func:`parking`): 3-4 MFLOP
MLPs 10-15% faster on one thread, the 12.6 MFLOP MLP above the same on one or two (a parked
run costs 15-30 us), 50 MFLOP 1.6x faster on two.

Where one thread stops paying depends on the CPU: on a 2-core Intel Xeon (AVX-512, ORT 1.32) a
26.6 MFLOP MLP (3 x 256, batch 64) ran 13% faster on one thread than on two (0.218 against
0.251 ms per call; right after a PyTorch matmul 6% faster), where the AMD machine's 12.6 MFLOP
one ran the same either way; the crossing point moves with the shapes too (Xeon: 28 MFLOP of
width 384 the same either way, 51 MFLOP of width 512 11% faster on two). So a region estimated
within :data:`TRIAL_REGION_FLOPS` runs a *thread trial*: its first calls alternate between a
session on one thread and one on PyTorch's count, and it keeps the faster
(:class:`ThreadTrial`, run by :class:`~.region.OrtRegion`).

A region's work is estimated in matrix-product operations (:func:`estimated_flops`): ORT's
elementwise kernels take as long per element as about :data:`ELEMENT_COST` of those, so a
region of elementwise ops is not mistaken for a small one. ResNet-18's training step (28
regions between PyTorch's convolutions, mostly batch norm and ReLU, 0.2-5 ms each): the
regions' time 19.4-20.4 -> 14.7-18.2 ms per step, the whole step 143.6 -> 141.2 ms (mean of 4
runs each, within the machine's noise: PyTorch's convolutions between the regions ran slower
beside the second ORT thread, which :data:`PARK_TRAINING` takes back).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..specs import OrtModel

__all__ = [
    "SMALL_REGION_FLOPS", "PARK_REGION_FLOPS", "PARK_TRAINING", "TRIAL_REGION_FLOPS", "TRIAL_AFTER", "TRIAL_CALLS",
    "TRIAL_MARGIN", "ELEMENT_COST", "ThreadTrial", "estimated_flops", "model_flops", "region_plan", "thread_trial",
    "parking",
]

#: Regions estimated below this much work per call (:func:`estimated_flops`) run on one ORT thread.
SMALL_REGION_FLOPS = 16e6

#: Multi-threaded regions estimated below this many floating-point operations per call run
#: without parking PyTorch's workers (:func:`parking`). A parked run opens an OpenMP region,
#: after which the workers busy-wait again, so back-to-back calls park every time (20-70 us
#: each); a short run gains less from parked workers than that costs. 2-core AMD EPYC, MLPs
#: (3 layers, batch 64, separate processes, alone / right after a 512x512 torch matmul):
#: 68 MFLOP (0.45 ms) 449 / 476 us unparked vs 494 / 557 parked; 150 MFLOP about equal;
#: 270 MFLOP (1.7 ms) 1716 / 2061 vs 1752 / 1833; 600 MFLOP 3.1 / 5.2 ms vs 3.1 / 3.3 ms.
PARK_REGION_FLOPS = 2e8

#: Training graphs park PyTorch's workers for every multi-threaded run, whatever its size:
#: PyTorch runs between their regions (the loss, the optimizer, autograd, operators kept in
#: PyTorch), so its workers are busy-waiting when a run starts and would share the second ORT
#: thread's core. ResNet-18 training (28 regions between PyTorch's convolutions, runs
#: alternating): 134.8 / 132.3 ms per step against 149.8 / 153.3 unparked; an MLP's the same.
PARK_TRAINING = True

#: Regions estimated within this range of floating-point operations per call (and planned on
#: more than one thread, without a thread count set in ``session_options``) time one thread
#: against PyTorch's count on their first calls and keep the faster (:class:`ThreadTrial`).
TRIAL_REGION_FLOPS = (8e6, 64e6)

#: calls a region makes on its planned runner before its trial starts (a program's first
#: calls pay first-time costs around the region: allocations, its first autograd steps)
TRIAL_AFTER = 4

#: timed calls per thread count in a trial (after one untimed call each: a new session's first
#: run allocates its memory)
TRIAL_CALLS = 8

#: a trial keeps one thread unless PyTorch's count is faster by more than this factor: one
#: thread leaves the other cores to the caller's PyTorch work between runs
TRIAL_MARGIN = 1.05

#: What one element costs ORT's other kernels (elementwise, reductions, copies), in the matrix
#: products' floating-point operations that take as long. Xeon, one ORT thread: an MLP's matrix
#: products run at about 156 flops per ns, elementwise chains at 2.5-3 elements per ns (6 ops on
#: 0.26M-1M floats). Counted as one per element, a chain of elementwise ops on 1M floats (6.3M)
#: was planned on one thread, where two ran it 1.8x faster (2.55 -> 1.38 ms; 0.26M floats 1.7x).
ELEMENT_COST = 60

#: matrix products, the quantized ones of ``precision="int8-dynamic"`` models included (their
#: first input is the left operand): counted as elementwise, the int8 feed-forward block's region
#: ran on one thread, 3.85x fp32 ort-lazy's speed where two threads give 6.7x
_MATMULS = {"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul", "DynamicQuantizeMatMul"}
_CONVS = {"Conv", "ConvTranspose", "ConvInteger"}  # weight: the second input
#: ops that move no data (ORT gives their output the input's buffer, or computes a shape)
_FREE = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant"}


def estimated_flops(model_bytes: bytes) -> float | None:
    """Rough work of one run of an ONNX model, in floating-point operations of matrix products:
    2*M*N*K per matrix product, 2*MACs per convolution, :data:`ELEMENT_COST` per element
    another node reads or writes (its largest input or output; none for ops that move no
    data); None when a shape it needs is symbolic or unknown."""
    import onnx

    proto = onnx.load_from_string(model_bytes)
    shapes = _shapes(proto.graph)
    needed = [o for n in proto.graph.node for o in n.output if o]
    if any(o not in shapes for o in needed):
        try:
            inferred = onnx.shape_inference.infer_shapes(proto)
        except Exception:
            return None
        shapes = _shapes(inferred.graph)
    total = 0.0
    for node in proto.graph.node:
        outs = [shapes.get(o) for o in node.output if o]
        if any(s is None for s in outs):
            return None
        numel = sum(math.prod(s) for s in outs)  # type: ignore[arg-type]
        if node.op_type in _MATMULS:
            a = shapes.get(node.input[0])
            if not a:
                return None
            k = a[0] if node.op_type == "Gemm" and _attr(node, "transA", 0) else a[-1]
            total += 2.0 * numel * k
        elif node.op_type in _CONVS:
            w = shapes.get(node.input[1])
            if w is None or len(w) < 3:
                return None
            if node.op_type == "Conv":  # weight [C_out, C_in / groups, *kernel]
                per_output = math.prod(w[1:])
            else:  # weight [C_in, C_out / groups, *kernel]: an upper bound per output element
                per_output = w[0] // max(_attr(node, "group", 1), 1) * math.prod(w[2:])
            total += 2.0 * numel * per_output
        elif node.op_type not in _FREE:
            read = max((math.prod(shapes[i]) for i in node.input if i in shapes), default=0)
            total += ELEMENT_COST * max(numel, read)
    return total


def model_flops(model: OrtModel) -> float | None:
    """:func:`estimated_flops` of ``model``, computed once and kept on it (the compile cache
    stores it with the model: a warm process plans its threads without parsing the model)."""
    return model.fact("work", estimated_flops)  # type: ignore[no-any-return]


def region_plan(flops: float | None) -> tuple[int | None, bool]:
    """(ORT intra-op threads, whether its runs park PyTorch's workers) for a model on the CPU
    estimated at ``flops`` per run (:func:`model_flops`): one thread below
    :data:`SMALL_REGION_FLOPS`, PyTorch's count above it, parked from
    :data:`PARK_REGION_FLOPS` on (and when the work cannot be estimated)."""
    if flops is None:
        return None, True
    if flops < SMALL_REGION_FLOPS:
        return 1, False
    return None, flops >= PARK_REGION_FLOPS


def thread_trial(flops: float | None) -> bool:
    """Whether a CPU region estimated at ``flops`` per call runs a :class:`ThreadTrial`."""
    return flops is not None and TRIAL_REGION_FLOPS[0] <= flops < TRIAL_REGION_FLOPS[1]


class ThreadTrial:
    """Alternate a region's calls between two runners (``planned``, then ``other``), time them,
    and name the faster one: one thread wins unless the other is faster by :data:`TRIAL_MARGIN`.

    Each runner's first call is left out of its times. The runners are opaque here; ``one``
    says which of them runs on one thread.
    """

    def __init__(self, planned: Any, other: Any, one: Any, calls: int = TRIAL_CALLS) -> None:
        self.planned = planned
        self._runners = (planned, other)
        self._one = one
        self._times: tuple[list[float], list[float]] = ([], [])
        self._calls = calls
        self._turn = 0

    def runner(self) -> Any:
        """The runner for the next call."""
        return self._runners[self._turn % 2]

    def record(self, runner: Any, seconds: float) -> None:
        """One call of ``runner`` took ``seconds``."""
        if runner is not self._runners[self._turn % 2]:
            return  # another thread's call in between: not this turn's
        if self._turn >= 2:
            self._times[self._turn % 2].append(seconds)
        self._turn += 1

    def winner(self) -> Any | None:
        """The faster runner once both have :data:`TRIAL_CALLS` timed calls, else None."""
        if min(len(t) for t in self._times) < self._calls:
            return None
        one, other = self.medians()
        return self._one if one <= other * TRIAL_MARGIN else self.other(self._one)

    def other(self, runner: Any) -> Any:
        """The trial's runner that is not ``runner``."""
        return self._runners[1] if runner is self._runners[0] else self._runners[0]

    def medians(self) -> tuple[float, float]:
        """Median seconds per call of (the one-thread runner, the other)."""
        first = statistics.median(self._times[0])
        second = statistics.median(self._times[1])
        return (first, second) if self._one is self._runners[0] else (second, first)


def _attr(node: Any, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _shapes(graph: Any) -> dict[str, tuple[int, ...]]:
    """Static shapes of every value the graph declares (inputs, outputs, value_info, initializers)."""
    out: dict[str, tuple[int, ...]] = {}
    for init in graph.initializer:
        out[init.name] = tuple(int(d) for d in init.dims)
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        ttype = value.type.tensor_type
        if not ttype.HasField("shape"):
            continue
        dims = ttype.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[value.name] = tuple(int(d.dim_value) for d in dims)
    return out


@functools.cache
def parking() -> Callable[..., Any] | None:
    """``run(fn, *args)`` that calls ``fn(*args)`` while PyTorch's idle OpenMP workers of the
    calling thread wait blocked, and returns whether they did; None where that cannot be done
    (decided once per process).

    After each parallel op, an OpenMP worker busy-waits for the next region for milliseconds
    (libgomp's default spin count); an ORT run in that window shares its cores with the
    spinning workers (TransformerEncoderLayer right after a 512x512 torch matmul: 1.3x its time
    alone on 2 cores). The bridge's ``run_parked`` opens an OpenMP region and parks the workers
    in it for the run, when one of them is running (asleep, they compete with nothing, and
    waking one costs up to milliseconds on an idle virtual CPU). Needs Linux, torch on OpenMP
    and the bridge built with it; checked to reuse torch's own workers (a second OpenMP
    runtime would start threads of its own).
    """
    import torch

    if not sys.platform.startswith("linux") or not torch._C.has_openmp:
        return None
    from .bridge import BridgeUnavailableError, load_bridge

    try:
        bridge = load_bridge()
    except BridgeUnavailableError:
        return None
    run = getattr(bridge, "run_parked", None)
    if run is None or not bridge.openmp_enabled():
        return None
    # torch's workers exist once a parallel op ran; a region of the same runtime reuses them
    # (the first runner may be opened while dynamo traces with fake tensors: a real op here)
    from .._compat import real_tensor_mode

    with real_tensor_mode():
        torch.zeros(1 << 16).add_(1)
    tasks = "/proc/self/task"
    try:
        before = len(os.listdir(tasks))
        run(lambda: None)
        after = len(os.listdir(tasks))
    except OSError:
        return None
    return run if after <= before else None

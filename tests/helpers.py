"""Helpers shared by the parity tests."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ort_lazy import metrics


def compile_ort(model: Any, **options: Any) -> Any:
    """``torch.compile(model, backend="ort")`` with a fresh dynamo cache for this model."""
    torch._dynamo.reset()
    if options:
        return torch.compile(model, backend="ort", options=options)
    return torch.compile(model, backend="ort")


def max_rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference over the largest magnitude of ``expected`` (in float32):
    the error measure of the reduced-precision tests."""
    return float((actual.float() - expected.float()).abs().max() / expected.float().abs().max())


def assert_close(actual: Any, expected: Any, rtol: float = 1e-4, atol: float = 1e-5, scale: bool = True) -> None:
    """Compare tensors (or sequences of them); ``scale`` makes atol relative to the largest |value|."""
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol, atol, scale)
        return
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = atol
    if scale and expected.numel() and expected.is_floating_point():
        finite = expected[torch.isfinite(expected)]
        if finite.numel():
            tol = max(atol, atol * float(finite.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=tol, equal_nan=True)


def take_sessions() -> list[Any]:
    """The ORT sessions the session cache holds, which it then drops."""
    from ort_lazy.runtime.session_cache import session_cache

    cache = session_cache()
    sessions = [v[0] for v in cache._items.values()]
    cache.clear()
    return sessions


def cuda_ready() -> bool:
    """Whether torch sees a GPU and the installed onnxruntime has ``CUDAExecutionProvider``."""
    if not torch.cuda.is_available():
        return False
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def trt_problem() -> str | None:
    """Why TensorRT cannot run here (no GPU, no CUDA or TensorRT provider in onnxruntime, or
    TensorRT's libnvinfer does not load), or None."""
    if not cuda_ready():
        return "needs a CUDA GPU and onnxruntime-gpu (CUDAExecutionProvider)"
    from ort_lazy.runtime.tensorrt import library_problem

    return library_problem()


def cuda_sessions() -> list[Any]:
    """:func:`take_sessions`, each checked to run on ORT's CUDA provider (none may be missing)."""
    sessions = take_sessions()
    assert sessions, "no ORT session was created"
    for s in sessions:
        assert s.get_providers()[0] == "CUDAExecutionProvider", s.get_providers()
    return sessions


def assert_ran_on_ort(min_runs: int = 1) -> dict[str, int]:
    """Fail unless ORT actually ran (a silent fallback cannot pass)."""
    c = metrics.counters()
    assert c["ort_runs"] >= min_runs, f"ORT did not run: {c}"
    return c


def train_parity(
    make: Callable[[], torch.nn.Module],
    inputs: Sequence[torch.Tensor],
    steps: int = 3,
    lr: float = 0.01,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    **options: Any,
) -> None:
    """Train an eager copy and an ort-compiled copy with SGD; outputs, grads and weights match."""
    torch.manual_seed(0)
    ref = make()
    ort_model = copy.deepcopy(ref)
    compiled = compile_ort(ort_model, **options)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
    opt_ort = torch.optim.SGD(ort_model.parameters(), lr=lr)
    for _ in range(steps):
        for model, fn, opt in ((ref, ref, opt_ref), (ort_model, compiled, opt_ort)):
            opt.zero_grad()
            out = fn(*inputs)
            out.float().pow(2).mean().backward()
            if model is ref:
                expected_out = out.detach()
            else:
                assert_close(out.detach(), expected_out, rtol, atol)
        for p_ref, p_ort in zip(ref.parameters(), ort_model.parameters()):
            if p_ref.grad is None:
                assert p_ort.grad is None
                continue
            assert_close(p_ort.grad, p_ref.grad, rtol, atol)
        opt_ref.step()
        opt_ort.step()
    for p_ref, p_ort in zip(ref.parameters(), ort_model.parameters()):
        assert_close(p_ort.detach(), p_ref.detach(), rtol, atol)


def bridge_marks() -> list[Any]:
    """pytest marks for tests needing the compiled bridge: skipped, with the reason, when not built."""
    import pytest

    from ort_lazy.frontends import jit as jit_frontend

    try:
        jit_frontend.load_bridge()
        error = None
    except jit_frontend.BridgeUnavailableError as e:
        error = str(e)
    return [pytest.mark.bridge, pytest.mark.skipif(error is not None, reason=f"bridge not built: {error}")]


def tiered(values: Sequence[Any], fast: Any, *, unpack: bool = False) -> list[Any]:
    """``values`` for ``pytest.mark.parametrize`` with the ones outside the fast subset in the
    full tier (marked ``full``; see ``conftest.py``): ``fast`` is a collection of the values the
    default run takes, a predicate on a value, or an int N: every Nth value, the first included
    (for long lists of cases of one kind). ``unpack``: each value is a tuple of several
    arguments (``parametrize("a,b", ...)``); a ``pytest.param`` value keeps its id and marks."""
    import pytest

    values = list(values)
    if isinstance(fast, int):
        kept = [i % fast == 0 for i in range(len(values))]
    elif callable(fast):
        kept = [bool(fast(v)) for v in values]
    else:
        chosen = list(fast)
        kept = [v in chosen for v in values]
    out = []
    for value, keep in zip(values, kept):
        if keep:
            out.append(value)
        elif isinstance(value, type(pytest.param(None))):  # a pytest.param already: keep its id and marks
            out.append(pytest.param(*value.values, id=value.id, marks=[*value.marks, pytest.mark.full]))
        else:
            out.append(pytest.param(*(value if unpack else (value,)), marks=pytest.mark.full))
    return out


def run_in_threads(worker: Callable[[int], None], count: int = 8, timeout: float = 300.0) -> None:
    """Run ``worker(i)`` in ``count`` threads started together; fail on any error or deadlock."""
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def guarded(i: int) -> None:
        try:
            barrier.wait()
            worker(i)
        except BaseException as e:  # reported after join
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "deadlock: a worker did not finish"
    assert not errors, errors[0]


@contextlib.contextmanager
def captured_exports() -> Iterator[list[Any]]:
    """Collect every OrtModel the dynamo/fx path exports inside the block."""
    from ort_lazy.export import cache

    captured: list[Any] = []
    real = cache.export_graph

    def spy(gm: Any, name: str, constants: Any = None, providers: Any = None, **kwargs: Any) -> Any:
        model = real(gm, name, constants, providers, **kwargs)
        captured.append(model)
        return model

    cache.export_graph = spy  # every export of the dynamo/fx path goes through the cache module
    try:
        yield captured
    finally:
        cache.export_graph = real


def aten_graph(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    """``fn`` traced to aten ops by ``make_fx``, every node's ``meta['val']`` a fake tensor (what
    the exporter reads), for export tests that start from a function."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = make_fx(fn)(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        FakeTensorProp(gm, mode).propagate(*args)
    return gm


def _value_sizes(model_bytes: bytes) -> tuple[Any, dict[str, int]]:
    """The model with ONNX's inferred shapes, and the element count of each value whose shape
    inference fixed."""
    import math

    import onnx

    proto = onnx.shape_inference.infer_shapes(onnx.load_from_string(model_bytes))
    sizes = {}
    for value in list(proto.graph.value_info) + list(proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            sizes[value.name] = math.prod(d.dim_value for d in dims)
    return proto, sizes


def full_size_nodes(model_bytes: bytes, numel: int) -> list[str]:
    """Op types of the nodes of an ONNX model that write a tensor of ``numel`` elements (full
    passes over an input of that size), by ONNX shape inference."""
    proto, sizes = _value_sizes(model_bytes)
    return [n.op_type for n in proto.graph.node if any(sizes.get(o) == numel for o in n.output)]


def largest_value(model_bytes: bytes) -> tuple[int, str]:
    """The element count and op type of the largest tensor a node of an ONNX model writes."""
    _, numel, op = growth(model_bytes)
    return numel, op


def growth(model_bytes: bytes) -> tuple[float, int, str]:
    """How many times the largest tensor a node of an ONNX model writes is larger than the
    largest of its inputs, weights and outputs; that tensor's size and op type (shapes ONNX's
    inference fixes; symbolic ones count as unknown)."""
    import math

    proto, sizes = _value_sizes(model_bytes)
    edges = [math.prod(t.dims) for t in proto.graph.initializer]
    for value in list(proto.graph.input) + list(proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            edges.append(math.prod(d.dim_value for d in dims))
    numel, op = max(((sizes.get(o, 0), n.op_type) for n in proto.graph.node for o in n.output), default=(0, ""))
    return numel / max(max(edges, default=1), 1), numel, op


@contextlib.contextmanager
def torch_decomposition_of(op: Any) -> Iterator[None]:
    """Inside the block ``op`` lowers by torch's own decomposition instead of ort-lazy's rewrite
    (so a test can show its check fails without the rewrite)."""
    from unittest import mock

    from ort_lazy.lowering import decompositions, rewrites
    from ort_lazy.lowering.common import _torch_decomposition

    table = dict(rewrites.DECOMPOSITIONS)
    table[op] = lambda *a: _torch_decomposition(op, *a)
    decompositions.decomposition_table.cache_clear()
    try:
        with mock.patch.object(decompositions, "DECOMPOSITIONS", table):
            yield
    finally:
        decompositions.decomposition_table.cache_clear()


class ChannelsLastBlock(torch.nn.Module):
    """A ConvNeXt block: depthwise convolution, then a channels-last MLP (permuted in and out),
    added back. PyTorch's tensors between the two are channels-last; an ORT region's are
    contiguous."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.dwconv = torch.nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(y))))
        return y.permute(0, 3, 1, 2) + x  # channels-last, as the first operand

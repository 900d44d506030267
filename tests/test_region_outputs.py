"""What a region returns: values ORT computed, never a copy made only to change a shape.

ORT writes each region output into a tensor of its own, so a ``view``/``reshape``/``squeeze``/
``unsqueeze`` that a region returns is a full copy of the value it views (a TransformerEncoderLayer
training step copied 11.6 MB per step this way). Views of at least
:data:`ort_lazy.partition.VIEW_OUTSIDE_BYTES` read after a region are made by PyTorch instead.
Each case checks the results against eager, that ORT ran, and the class itself: no exported
region returns a large value through a shape op, static or symbolic (dynamic shapes).

And the layout of what a region returns: ORT writes every value row-major where eager's was
channels-last or permuted; PyTorch's ops that read strides, and the caller of a compiled graph,
get such values in eager's layout (a copy only then).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import (
    ChannelsLastBlock,
    assert_close,
    assert_ran_on_ort,
    captured_exports,
    compile_ort,
    tiered,
    train_parity,
)
from ort_lazy import metrics
from ort_lazy.partition import VIEW_OUTSIDE_BYTES

#: values of this size are large enough to be viewed outside (checked against the module's threshold)
_LARGE = 1 << 18
_SHAPE_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_G = torch.Generator().manual_seed(0)


def _shape_op_outputs(models: list[Any]) -> list[tuple[str, str, int]]:
    """(region, op, bytes as float32, -1 when symbolic) of each region output a shape op writes."""
    import onnx

    found = []
    for m in models:
        graph = onnx.shape_inference.infer_shapes(onnx.load_from_string(m.model_bytes)).graph
        made_by = {o: n.op_type for n in graph.node for o in n.output}
        for out in graph.output:
            dims = out.type.tensor_type.shape.dim
            size = math.prod(d.dim_value for d in dims) * 4 if all(d.HasField("dim_value") for d in dims) else -1
            if made_by.get(out.name) in _SHAPE_OPS:
                found.append((m.name, made_by[out.name], size))
    return found


def _rows(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_G)


_W = _rows(64, 64)


def _returned_view(x: torch.Tensor) -> Any:
    y = (x @ _W.to(x.dtype)).relu()
    return y.view(-1), y.sum(0)  # y read inside (the sum) and, viewed, after the region


def _view_of_view(x: torch.Tensor) -> Any:
    v = (x @ _W.to(x.dtype)).tanh().view(8, 128, 64)
    flat = v.reshape(1024, 64)
    return v, flat @ _W.to(x.dtype), flat.unsqueeze(0)  # two views of one value, one also read inside


def _input_view_read_by_pytorch(x: torch.Tensor) -> Any:
    v = x.view(8, 128, 64)  # read inside the region and by the cumsum, excluded from ORT
    return (v * 2).sin(), torch.cumsum(v, 1)


def _squeezed(x: torch.Tensor) -> Any:
    y = (x @ _W.to(x.dtype)).unsqueeze(1)
    return y.squeeze(1).exp(), torch.cumsum(y, 0)


CASES: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "returned view of a value read inside": (_returned_view, {}),
    "view of a view, both read after": (_view_of_view, {}),
    "view of the input read by PyTorch": (_input_view_read_by_pytorch, {"torch_executed_ops": ("aten.cumsum",)}),
    "unsqueeze read by PyTorch, squeeze returned": (_squeezed, {"torch_executed_ops": ("aten.cumsum",)}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_large_views_after_a_region_are_made_in_pytorch(name: str) -> None:
    """Eager's values, ORT ran, and no region returns a large value through a shape op.

    The yardstick is eager in float64: PyTorch's float32 product of these sizes came out up to
    1e-3 off in some runs (1.6e-5 in others), which failed the comparison now and then."""
    fn, options = CASES[name]
    x = _rows(1024, 64)  # 256 KiB values, at the threshold
    expected = [t.float() for t in fn(x.double())]
    metrics.reset()
    with captured_exports() as models:
        actual = compile_ort(fn, **options)(x)
    assert_close(actual, expected)
    assert_ran_on_ort()
    assert models
    assert not [f for f in _shape_op_outputs(models) if f[2] >= _LARGE or f[2] < 0], _shape_op_outputs(models)


def test_views_keep_eager_s_aliasing() -> None:
    """Two views of one value alias each other as in eager (what PyTorch's view gives)."""
    x = _rows(1024, 64)
    eager = _view_of_view(x)
    metrics.reset()
    ours = compile_ort(_view_of_view)(x)
    assert_ran_on_ort()
    assert eager[0].untyped_storage().data_ptr() == eager[2].untyped_storage().data_ptr()
    assert ours[0].untyped_storage().data_ptr() == ours[2].untyped_storage().data_ptr()
    assert_close(ours, eager)


def test_small_views_stay_in_the_region() -> None:
    """Below the threshold ORT's copy costs less than a PyTorch call: the region returns the view."""
    w = _rows(16, 16)

    def fn(x: torch.Tensor) -> Any:
        y = (x @ w).relu()
        return y.view(-1), y.sum(0)

    x = _rows(8, 16)
    assert x.numel() * 4 < VIEW_OUTSIDE_BYTES <= _LARGE
    metrics.reset()
    with captured_exports() as models:
        actual = compile_ort(fn)(x)
    assert_close(actual, fn(x))
    assert_ran_on_ort()
    assert ("Reshape", x.numel() * 4) in [(op, size) for _, op, size in _shape_op_outputs(models)]


def test_training_regions_return_no_large_views() -> None:
    """Forward and backward of a transformer layer, its large ReLU gradient in PyTorch between
    two backward regions (the default): gradients as eager's, no region output a large shape op
    writes (11.6 MB of them per step before)."""
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    ours = copy.deepcopy(ref)
    x = _rows(8, 64, 128)  # 256 KiB activations; a ReLU gradient of 131072 elements: preferred in PyTorch
    ref(x).square().mean().backward()
    metrics.reset()
    with captured_exports() as models:
        compile_ort(ours)(x).square().mean().backward()
    assert_ran_on_ort(3)
    assert {"forward", "backward"} <= {m.name.split("_")[0] for m in models}, [m.name for m in models]
    for p_ref, p_ours in zip(ref.parameters(), ours.parameters()):
        assert_close(p_ours.grad, p_ref.grad, rtol=1e-4, atol=1e-5)
    large = [f for f in _shape_op_outputs(models) if f[2] >= _LARGE or f[2] < 0]
    assert not large, large


def test_symbolic_views_are_made_in_pytorch_too() -> None:
    """Views whose sizes the graph computes (dynamic shapes) read those sizes outside the region:
    eager's values for two lengths, one graph, no region output a shape op writes."""

    def fn(x: torch.Tensor) -> Any:
        y = (x @ _W).relu()
        return y.view(-1), y.sum(0)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="ort", dynamic=True)
    metrics.reset()
    with captured_exports() as models:
        for rows in (1024, 1100):
            x = _rows(rows, 64)
            assert_close(compiled(x), fn(x))
    assert_ran_on_ort(2)
    assert len(models) == 1, [m.name for m in models]
    assert not [f for f in _shape_op_outputs(models) if f[2] >= _LARGE or f[2] < 0], _shape_op_outputs(models)


@pytest.mark.full
def test_dynamic_training_regions_return_no_large_views() -> None:
    """A transformer layer trained on two batch sizes under dynamic shapes, its ReLU gradient in
    PyTorch between two backward regions: eager's gradients each time, and no region returns a
    view of a symbolic size."""
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    ours = copy.deepcopy(ref)
    torch._dynamo.reset()
    options = {"torch_executed_ops": ("aten.threshold_backward",)}
    compiled = torch.compile(ours, backend="ort", dynamic=True, options=options)
    metrics.reset()
    with captured_exports() as models:
        for batch in (8, 10):
            x = _rows(batch, 64, 128)
            for m in (ref, ours):
                m.zero_grad()
            ref(x).square().mean().backward()
            compiled(x).square().mean().backward()
            for p_ref, p_ours in zip(ref.parameters(), ours.parameters()):
                assert_close(p_ours.grad, p_ref.grad, rtol=1e-4, atol=1e-5)
    assert_ran_on_ort(6)  # a forward and two backward regions per step
    symbolic = [f for f in _shape_op_outputs(models) if f[2] < 0]
    assert not symbolic, symbolic


class _ChannelsLastNet(torch.nn.Module):
    """Convolutions on channels-last tensors (the model and its input converted), flattened."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return y.permute(0, 2, 3, 1).view(y.shape[0], -1)  # a view eager can make of channels-last only


_LAYOUT_MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]] = {
    "ConvNeXt blocks": (
        lambda: torch.nn.Sequential(ChannelsLastBlock(), ChannelsLastBlock()),
        lambda: torch.randn(2, 16, 6, 6, generator=_G),
    ),
    "channels-last network": (
        lambda: _ChannelsLastNet().to(memory_format=torch.channels_last),
        lambda: torch.randn(2, 3, 8, 8, generator=_G).contiguous(memory_format=torch.channels_last),
    ),
}

#: ops kept in PyTorch so that its views, permutes and products read values regions computed
_LAYOUT_CUTS = {
    "permute and view": ("aten.permute", "aten.view"),
    "views": ("aten.view", "aten._unsafe_view"),
    "convolutions": ("aten.convolution", "aten.convolution_backward"),
}


_LAYOUT_PAIRS = [(model, cut) for cut in _LAYOUT_CUTS for model in _LAYOUT_MODELS]
#: every model and every cut once by default
_LAYOUT_FAST = [("ConvNeXt blocks", "views"), ("channels-last network", "convolutions"), ("ConvNeXt blocks", "permute and view")]


@pytest.mark.parametrize(
    "model,cut", tiered(_LAYOUT_PAIRS, _LAYOUT_FAST, unpack=True), ids=[f"{m}-{c}" for m, c in _LAYOUT_PAIRS]
)
def test_pytorch_reads_region_outputs_in_the_traced_layout(model: str, cut: str) -> None:
    """ORT returns every value contiguous; PyTorch made some channels-last (a channels-last
    network, a ``permute`` back after a channels-last layer norm), and the graph's PyTorch ops
    were traced with those strides: a ``view`` after a ``permute`` of such a value raised in
    PyTorch (in the forward graph, and in the backward one, which reads the saved tensors
    forward regions returned). The training steps match eager with each cut, and ORT ran."""
    make, example = _LAYOUT_MODELS[model]
    metrics.reset()
    torch._dynamo.reset()
    train_parity(make, [example()], steps=2, torch_executed_ops=_LAYOUT_CUTS[cut])
    c = assert_ran_on_ort(min_runs=4)
    assert c.get("fallback_ops", 0) > 0, c  # the cut really kept ops in PyTorch


_CONV = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)


def _channels_last_values(x: torch.Tensor) -> Any:
    y = torch.relu(_CONV(x))
    return y, y.permute(0, 2, 3, 1), y.flatten(2)  # channels-last, and two views of it


_OUTPUT_LAYOUT_CASES: dict[str, tuple[Callable[[], Callable[..., Any]], Callable[[], torch.Tensor]]] = {
    "channels-last values and their views": (
        lambda: _channels_last_values,
        lambda: torch.randn(2, 3, 10, 10, generator=_G).contiguous(memory_format=torch.channels_last),
    ),
    "ConvNeXt block (permuted back, added)": (
        lambda: ChannelsLastBlock().eval(),
        lambda: torch.randn(2, 16, 6, 6, generator=_G),
    ),
}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("case", list(_OUTPUT_LAYOUT_CASES))
def test_outputs_have_eager_s_layout(case: str, grad: bool) -> None:
    """What a compiled graph returns is laid out as eager's (channels-last where eager's is),
    in inference and in training's forward (where AOTAutograd regenerates the views from a
    base ORT computed): the user's code after the graph (a ``view`` of a ``permute``, a
    memory-format check) sees what it sees in eager. ORT returns every value contiguous."""
    make, example = _OUTPUT_LAYOUT_CASES[case]
    fn, x = make(), example()
    metrics.reset()
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        expected = fn(x)
        actual = compile_ort(fn)(x)
    assert_ran_on_ort()
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for got, want in zip(actual, expected, strict=True):
        assert_close(got.detach(), want.detach())
        assert got.stride() == want.stride(), (got.stride(), want.stride())


@pytest.mark.parametrize(
    ("shape", "strides", "order"),
    [
        ((2, 3, 4, 5), (60, 1, 15, 3), (0, 2, 3, 1)),  # channels-last
        ((2, 3), (1, 2), (1, 0)),  # transposed copy
        ((2, 3), (3, 1), None),  # contiguous
        ((3, 1, 4), (4, 100, 1), None),  # contiguous: a dim of size 1 has any stride
        ((0, 3), (3, 1), None),  # empty
        ((2, 3), (6, 1), None),  # a slice: not dense
    ],
)
def test_traced_order_and_in_layout(shape: tuple[int, ...], strides: tuple[int, ...], order: Any) -> None:
    """The layouts the pass restores: dense and not contiguous only; ``in_layout`` returns a
    tensor already in the layout itself, else a copy in it with the same values."""
    from ort_lazy.runtime.region import in_layout, traced_order

    traced = torch.empty_strided(shape, strides)
    assert traced_order(traced) == order
    if order is None:
        return
    row_major = torch.randn(shape, generator=_G)
    laid_out = in_layout(row_major, order)
    assert laid_out.stride() == traced.stride() and torch.equal(laid_out, row_major)
    assert in_layout(laid_out, order) is laid_out


def test_dynamic_channels_last_graphs_compile_once() -> None:
    """Symbolic values get no layout pass (reading their strides would specialize the sizes):
    a channels-last graph compiled with dynamic shapes runs two sizes from one compile, with
    eager's values."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from ort_lazy.frontends.dynamo import ort_backend

    counter = CompileCounterWithBackend(ort_backend)
    compiled = torch.compile(_channels_last_values, backend=counter, dynamic=True)
    metrics.reset()
    torch._dynamo.reset()
    for size in (10, 12):
        x = torch.randn(2, 3, size, size, generator=_G).contiguous(memory_format=torch.channels_last)
        for got, want in zip(compiled(x), _channels_last_values(x), strict=True):
            assert_close(got.detach(), want.detach())
    assert counter.frame_count == 1, counter.frame_count
    assert_ran_on_ort(2)

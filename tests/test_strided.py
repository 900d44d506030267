"""``as_strided`` and ``as_strided_scatter`` address memory, not values: eager's results for
every layout eager can give their input (transposed views, permuted results, channels-last
convolutions, slices, non-contiguous graph inputs, inputs that are views with an offset),
forward and backward. The class of ``x.t().as_strided(...)``, which ORT once read in row-major
order, silently. Each case also says whether the call runs on ORT or, reading a graph input's
own memory, in PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, assert_ran_on_ort, bridge_marks, compile_ort
from ort_lazy import metrics

_W = torch.randn(4, 3, 1, 1, generator=torch.Generator().manual_seed(1))


def _channels_last_conv(x: torch.Tensor) -> torch.Tensor:
    y = F.conv2d(x.to(memory_format=torch.channels_last), _W)  # eager: a channels-last result
    return y.as_strided((2, 8), (1, 2)) * 1.0


def _arange(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.arange(float(torch.Size(shape).numel())).reshape(shape) * 0.5 - 1


def _transposed_input() -> torch.Tensor:
    return torch.randn(3, 2, generator=torch.Generator().manual_seed(2)).t()  # strides (1, 2)


def _offset_input() -> torch.Tensor:
    return torch.randn(7, generator=torch.Generator().manual_seed(3))[1:]  # storage offset 1


def _every_other_column() -> torch.Tensor:
    return torch.randn(2, 6, generator=torch.Generator().manual_seed(6))[:, ::2]  # not dense


ORT, GRAPH_IN_PYTORCH = "ort", "graph in PyTorch"

#: name: (function, its input, where it runs: on ORT, or the whole graph in PyTorch)
READS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[], torch.Tensor], str]] = {
    "transposed-view": (lambda x: x.t().as_strided((3, 2), (1, 3)) * 2, _arange(2, 3), ORT),
    "permuted-view": (lambda x: x.permute(2, 0, 1).as_strided((4, 3), (1, 4)) + 1, _arange(2, 3, 4), ORT),
    "transposed-result": (lambda x: (x.t() + 1).as_strided((6,), (1,)) * 1, _arange(2, 3), ORT),
    "channels-last-conv": (_channels_last_conv, _arange(1, 3, 2, 4), ORT),
    "slice-of-result": (lambda x: (x * 2)[1:].as_strided((2, 2), (1, 2)) + 0, _arange(3, 3), ORT),
    "before-the-slice": (lambda x: (x * 2)[1:].as_strided((2, 2), (1, 2), 0) + 0, _arange(3, 3), ORT),
    "expanded-column": (lambda x: x[:, :1].expand(2, 3).as_strided((2, 2), (3, 1)) * 3, _arange(2, 3), ORT),
    "overlapping-read": (lambda x: x.as_strided((3, 3), (1, 1)) - 1, _arange(2, 3), ORT),
    "twice": (lambda x: x.t().as_strided((3, 2), (1, 3)).as_strided((2, 2), (2, 1), 1) * 1, _arange(2, 3), ORT),
    "transposed-input": (lambda x: x.as_strided((2, 3), (3, 1)) * 1, _transposed_input, ORT),
    "offset-input": (lambda x: x.as_strided((2, 2), (2, 1)) * 1, _offset_input, ORT),
    # reads the columns between the input's: memory only PyTorch, on the real tensor, can read
    "between-columns": (lambda x: x.as_strided((2, 2), (6, 1)) * 1, _every_other_column, GRAPH_IN_PYTORCH),
}


def _as_strided_fallbacks() -> dict[str, dict[str, int]]:
    return {op: r for op, r in metrics.fallbacks().items() if "as_strided" in op}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", list(READS))
def test_as_strided_reads_eager_elements(name: str, dtype: torch.dtype) -> None:
    fn, make, where = READS[name]
    if dtype is not torch.float32 and name == "channels-last-conv":
        pytest.skip("convolution is floating point")
    x = make()
    if dtype is not torch.float32:  # the same layout, other values
        x = _relaid(x, (x * 2).round().to(dtype) if dtype is torch.int64 else x > 0)
    metrics.reset()
    expected = _eager(fn, x)
    got = compile_ort(fn)(x)
    if name == "channels-last-conv":
        # ORT's convolution may sum in another order than PyTorch's on some CPUs (a rounding
        # step apart); a read of the wrong elements is off by whole values
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    else:
        assert got.dtype == expected.dtype and torch.equal(got, expected), (got, expected)
    _check_where_it_ran(where)


def _relaid(like: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` with ``like``'s strides and storage offset (a view of a fresh storage)."""
    storage = torch.zeros(like.storage_offset() + like.untyped_storage().nbytes() // like.element_size(), dtype=values.dtype)
    out = storage.as_strided(like.shape, like.stride(), like.storage_offset())
    out.copy_(values)
    return out


def _eager(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except RuntimeError as e:  # integer/bool inputs where the case multiplies by a float
        pytest.skip(f"eager rejects it: {e}")


def _check_where_it_ran(where: str) -> None:
    c = metrics.counters()
    assert c["export_failures"] == c["ort_failures"] == c["fallback_regions"] == 0, c
    if where == ORT:
        assert c["ort_runs"] >= 1 and c["compile_failures"] == 0, c
        assert not _as_strided_fallbacks(), _as_strided_fallbacks()
    else:  # counted, and nothing of the graph on ORT
        assert c["ort_runs"] == 0 and c["compile_failures"] == 1, c


@pytest.mark.parametrize("name", [n for n in READS if READS[n][2] == ORT])
def test_as_strided_gradients(name: str) -> None:
    """The backward scatters the gradient into the addressed positions
    (``as_strided_scatter``): on ORT too, in the input's storage order."""
    fn, make, _ = READS[name]
    mine, ref = make().requires_grad_(), make().requires_grad_()
    metrics.reset()
    got, expected = compile_ort(fn)(mine), fn(ref)
    assert_close(got.detach(), expected.detach())
    weights = torch.arange(float(expected.numel())).reshape(expected.shape)
    (got * weights).sum().backward()
    (expected * weights).sum().backward()
    assert_close(mine.grad, ref.grad)
    c = assert_ran_on_ort(2)
    assert c["export_failures"] == c["ort_failures"] == c["fallback_regions"] == 0, c
    assert not _as_strided_fallbacks(), _as_strided_fallbacks()


#: name: (base maker, src shape, size, stride, offset, where it runs)
SCATTERS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...], tuple[int, ...], tuple[int, ...], int, str]] = {
    "contiguous": (lambda x: x * 1, (2, 2), (2, 2), (1, 3), 1, ORT),
    "transposed-base": (lambda x: x.t() * 1, (2, 3), (2, 3), (3, 1), 0, ORT),
    "strided-rows": (lambda x: x + 0, (3,), (3,), (4,), 2, ORT),
    # positions are the storage's; writes outside the view are dropped by eager: the graph
    # runs in PyTorch
    "before-the-view": (lambda x: x[1:], (2, 2), (2, 2), (1, 4), 0, GRAPH_IN_PYTORCH),
}


@pytest.mark.parametrize("name", list(SCATTERS))
def test_as_strided_scatter_writes_eager_positions(name: str) -> None:
    base, src_shape, size, stride, offset, where = SCATTERS[name]
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    src = torch.randn(src_shape, generator=torch.Generator().manual_seed(5))

    def fn(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(base(x), src, size, stride, offset) * 1

    metrics.reset()
    expected = fn(x, src)
    got = compile_ort(fn)(x, src)
    assert torch.equal(got, expected), (got, expected)
    _check_where_it_ran(where)


def _scripted_transposed_view(x: torch.Tensor) -> torch.Tensor:
    return x.t().as_strided((3, 2), (1, 3)) * 2


def _scripted_transposed_result(x: torch.Tensor) -> torch.Tensor:
    return (x.t() + 1).as_strided((6,), (1,)) * 1


@pytest.mark.parametrize(
    "fn",
    [pytest.param(f, marks=bridge_marks(), id=i) for f, i in ((_scripted_transposed_view, "view"), (_scripted_transposed_result, "result"))],
)
def test_torchscript_graph_addressing_memory_runs_in_torchscript(fn: Callable[..., Any]) -> None:
    """A TorchScript graph does not carry eager's layouts: a graph holding ``as_strided`` is
    left unfused (an ORT group's row-major output read by it gave other elements), and counted."""
    import ort_lazy.jit

    x = torch.arange(6.0).reshape(2, 3)
    expected = fn(x)
    metrics.reset()
    with ort_lazy.jit.enable():
        scripted = torch.jit.script(fn)
        for _ in range(3):  # past the profiling runs
            got = scripted(x)
    assert torch.equal(got, expected), (got, expected)
    assert metrics.counters()["ort_runs"] == 0
    reasons = metrics.fallbacks().get("aten.as_strided.default", {})
    assert any("layout a TorchScript graph does not give" in r for r in reasons), metrics.fallbacks()

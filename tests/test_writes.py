"""Writes through views and indexing (functionalized into scatters and copies): eager's values,
forward and backward, on ORT, no region failing. A source smaller than its destination
broadcasts: the class of ``copy_`` from a row, whose translation once computed the row alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import assert_close, assert_ran_on_ort, compile_ort
from ort_lazy import metrics

_IDX = torch.tensor([0, 2])
_MASK = torch.tensor([True, False, True, False])
_PAIRS = torch.tensor([[0, 1], [2, 3], [4, 0], [1, 1]])

#: name: (write into a 4 x 5 tensor, extra inputs)
WRITES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "setitem-scalar": (lambda y: y.__setitem__(_IDX, 3.0), ()),
    "setitem-row-broadcast": (lambda y, r: y.__setitem__(_IDX, r), (torch.randn(5),)),
    "setitem-mask-scalar": (lambda y: y.__setitem__(_MASK, -1.0), ()),
    "setitem-ellipsis-none": (lambda y, r: y.__setitem__((Ellipsis, None, 2), r), (torch.randn(4, 1),)),
    "setitem-0d-tensor": (lambda y: y.__setitem__(0, torch.tensor(2.7)), ()),
    "slice-copy-broadcast": (lambda y, r: y[:, 1:3].copy_(r), (torch.randn(1, 2),)),
    "narrow-copy-0d": (lambda y, s: y.narrow(0, 1, 2).copy_(s), (torch.tensor(4.0),)),
    "copy-column": (lambda y, c: y.copy_(c), (torch.randn(4, 1),)),
    "fill-tensor": (lambda y, s: y[1].fill_(s), (torch.tensor(9.0),)),
    "index-put-accumulate": (lambda y, v: y.index_put_((torch.tensor([0, 0, 3]),), v, accumulate=True), (torch.randn(5),)),
    "masked-fill": (lambda y: y.masked_fill_(y > 0, 0.5), ()),
    "index-add": (lambda y, v: y.index_add_(1, torch.tensor([0, 4, 0]), v, alpha=2), (torch.randn(4, 3),)),
    "index-copy": (lambda y, v: y.index_copy_(0, torch.tensor([3, 1]), v), (torch.randn(2, 5),)),
    "scatter": (lambda y, v: y.scatter_(1, _PAIRS, v), (torch.randn(4, 2),)),
    "scatter-reduce-amax": (lambda y, v: y.scatter_reduce_(1, _PAIRS, v, "amax"), (torch.randn(4, 2),)),
    "masked-scatter": (lambda y, v: y.masked_scatter_(_MASK.unsqueeze(1).expand(4, 5), v), (torch.randn(10),)),
    "diagonal-fill": (lambda y: y.diagonal().fill_(7.0), ()),
    "transposed-add": (lambda y: y.t().add_(1), ()),
    "strided-view-zero": (lambda y: y.view(-1)[::3].zero_(), ()),
    "unsqueezed-mul": (lambda y: y.unsqueeze(0).mul_(2), ()),
    "as-strided-mul": (lambda y: y.as_strided((2, 2), (5, 1), 1).mul_(10), ()),
    "chained-views": (lambda y: y[1:].t()[2:].add_(100), ()),
}


def _written(write: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.clone()
        write(y, *extra)
        # a reduction and the tensor itself: a wrong shape inside the region cannot hide
        return y.sum(-1) * 1.0, y * 1.0

    return fn


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("name", list(WRITES))
def test_write_matches_eager(name: str, grad: bool) -> None:
    write, extra = WRITES[name]
    fn = _written(write)
    torch.manual_seed(0)
    x = torch.randn(4, 5)

    def leaves() -> list[torch.Tensor]:
        return [t.clone().requires_grad_(grad and t.is_floating_point()) for t in (x, *extra)]

    metrics.reset()
    mine, ref = leaves(), leaves()
    with torch.set_grad_enabled(grad):
        got = compile_ort(fn)(*mine)
        expected = fn(*ref)
    assert_close([g.detach() for g in got], [e.detach() for e in expected])
    if grad:
        for outs in (got, expected):
            (outs[0].sum() + (outs[1] * torch.arange(20.0).view(4, 5)).sum()).backward()
        for a, b in zip(mine, ref):
            assert (a.grad is None) == (b.grad is None)
            if b.grad is not None:
                assert_close(a.grad, b.grad)
    c = assert_ran_on_ort()
    assert c["export_failures"] == c["ort_failures"] == c["fallback_regions"] == 0, c

"""Aten clean-ups before partitioning: no-op expands and sums of zero-padded concatenations."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
import torch.fx
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import assert_ran_on_ort, train_parity
from ort_lazy.lowering import aten as lowering
from ort_lazy.lowering.simplify import drop_noop_expands, merge_disjoint_cats, simplify_aten

aten = torch.ops.aten


def _traced(fn: Any, *args: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def _count(gm: torch.fx.GraphModule, target: Any) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def _check_same(fn: Any, gm: torch.fx.GraphModule, *args: torch.Tensor) -> None:
    got, expected = gm(*args), fn(*args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_noop_expand_dropped_broadcasting_one_kept() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        same = aten.expand(x, [2, 3, 4]) * 2
        grown = aten.expand(y, [2, 3, 4]) + 1  # really broadcasts
        return same + grown

    x, y = torch.randn(2, 3, 4), torch.randn(1, 3, 4)
    gm = _traced(fn, x, y)
    assert drop_noop_expands(gm) == 1
    gm.graph.eliminate_dead_code()
    assert _count(gm, aten.expand.default) == 1
    _check_same(fn, gm, x, y)


def test_noop_expand_that_is_an_output_stays() -> None:
    gm = _traced(lambda x: aten.expand(x, [2, 3]), torch.randn(2, 3))
    assert drop_noop_expands(gm) == 0


def _select_backward_sum(g0: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
    """What the backward of unbinding a packed [3, ...] tensor computes."""
    z = lambda n: g0.new_zeros([n, *g0.shape[1:]])  # noqa: E731
    a = torch.cat([z(2), g2])
    b = torch.cat([z(1), g1, z(1)])
    c = torch.cat([g0, z(2)])
    return a + b + c


def test_disjoint_cats_become_one() -> None:
    gs = [torch.randn(1, 4, 5) for _ in range(3)]
    gm = _traced(_select_backward_sum, *gs)
    assert merge_disjoint_cats(gm) == 2
    gm.graph.eliminate_dead_code()
    assert _count(gm, aten.add.Tensor) == 0
    assert _count(gm, aten.cat.default) == 1
    _check_same(_select_backward_sum, gm, *gs)


def test_gaps_stay_zero_and_other_dims_merge() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        left = torch.cat([a, torch.zeros(3, 5)], dim=1)  # [3, 7]
        right = torch.cat([torch.full((3, 4), 0.0), b, torch.zeros(3, 1)], dim=1)
        return left + right

    a, b = torch.randn(3, 2), torch.randn(3, 2)
    gm = _traced(fn, a, b)
    assert merge_disjoint_cats(gm) == 1
    gm.graph.eliminate_dead_code()
    _check_same(fn, gm, a, b)
    assert _count(gm, aten.cat.default) == 1


@pytest.mark.parametrize(
    "case",
    ["overlap", "split-piece", "nonzero-fill", "negative-zero-fill", "alpha"],
)
def test_cats_that_are_not_disjoint_stay(case: str) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if case == "overlap":  # both fill rows 1-2
            return torch.cat([torch.zeros(1, 2), a]) + torch.cat([b, torch.zeros(1, 2)])
        if case == "split-piece":  # a spans rows 0-1, b row 1 only: overlap inside a piece
            return torch.cat([a[:2], torch.zeros(1, 2)]) + torch.cat([torch.zeros(1, 2), b[:1], torch.zeros(1, 2)])
        if case == "nonzero-fill":
            return torch.cat([torch.full((1, 2), 1.0), a]) + torch.cat([b, torch.zeros(1, 2)])
        if case == "negative-zero-fill":  # -0.0 + x is not x when x is -0.0... and not zero
            return torch.cat([torch.full((1, 2), -0.0), a[:1]]) + torch.cat([b[:1], torch.zeros(1, 2)])
        return torch.add(torch.cat([torch.zeros(1, 2), a[:1]]), torch.cat([b[:1], torch.zeros(1, 2)]), alpha=2)

    a, b = torch.randn(2, 2), torch.randn(2, 2)
    gm = _traced(fn, a, b)
    assert merge_disjoint_cats(gm) == 0
    _check_same(fn, gm, a, b)


def test_dynamic_shapes_are_left_alone() -> None:
    gm = make_fx(_select_backward_sum, tracing_mode="symbolic")(*(torch.randn(1, 4, 5) for _ in range(3)))
    assert simplify_aten(gm) == 0


def test_attention_training_has_neither_in_its_backward() -> None:
    """nn.MultiheadAttention (packed projection, matmul attention): gradients match eager, and
    the graphs handed to ORT keep no no-op expand and no addition of zero-padded cats."""
    found: list[str] = []
    graphs = 0
    real = lowering.compile_graph

    def check(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        nonlocal graphs
        graphs += 1
        for node in gm.graph.nodes:
            if node.target is aten.expand.default:
                if tuple(node.args[0].meta["val"].shape) == tuple(node.meta["val"].shape):
                    found.append(node.format_node())
            if node.target is aten.add.Tensor:
                if all(getattr(a, "target", None) is aten.cat.default for a in node.args):
                    found.append(node.format_node())
        return real(gm, *args, **kwargs)

    def make() -> nn.Module:
        return nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)

    with mock.patch.object(lowering, "compile_graph", check):
        train_parity(make, (torch.randn(2, 5, 16),), steps=2)
    assert_ran_on_ort(4)
    assert graphs == 2
    assert found == []


def _grow_cache(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """A decoding step's cache: concatenated, then read back by its (symbolic) length."""
    keys = torch.cat([cache, new], dim=1).tanh()
    return keys.reshape(keys.shape[0] * keys.shape[1], keys.shape[2]) * 2


def test_sizes_of_computed_tensors_read_from_inputs() -> None:
    """``sym_size`` of a computed tensor (``s0 + 1``, ``s1 * (s0 + 1)``) becomes arithmetic on
    the inputs' sizes; the graph computes the same at other sizes."""
    gm = make_fx(_grow_cache, tracing_mode="symbolic")(torch.randn(2, 5, 4), torch.randn(2, 1, 4))
    computed = [n for n in gm.graph.nodes if n.target is aten.sym_size.int and n.args[0].op != "placeholder"]
    assert computed, gm.graph
    assert simplify_aten(gm) == len(computed)
    assert all(n.args[0].op == "placeholder" for n in gm.graph.nodes if n.target is aten.sym_size.int)
    for shape in ((3, 7, 4), (1, 2, 4)):
        cache, new = torch.randn(*shape), torch.randn(shape[0], 1, 4)
        torch.testing.assert_close(gm(cache, new), _grow_cache(cache, new), rtol=0, atol=0)


def _attend_to_cache(cache: torch.Tensor, new: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """One decoding step of attention: the cache grows by the new key, the query attends to it
    (the 4-d ``matmul`` decomposes to ``bmm`` with views sized by the grown cache)."""
    keys = torch.cat([cache, new], dim=2)
    return torch.softmax(query @ keys.transpose(-1, -2), dim=-1) @ keys


def test_growing_cache_is_one_region_for_every_length() -> None:
    """End to end with dynamic shapes: the sizes read after the concatenation no longer split
    the ORT region (they did: each attention of a GPT-2 decoding step ended a region)."""
    from ort_lazy import metrics

    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(_attend_to_cache, backend="ort", dynamic=True)
    with torch.no_grad():
        for length in (3, 6, 9):
            args = (torch.randn(2, 2, length, 4), torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))
            torch.testing.assert_close(compiled(*args), _attend_to_cache(*args))
    c = assert_ran_on_ort(3)
    assert c["regions_compiled"] == 1 and c["sessions_created"] == 1, c

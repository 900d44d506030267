"""Higher-order ops and function transforms inside a compiled function: eager's values and gradients.

``torch.cond``, ``while_loop``, ``map``, ``associative_scan``, nested compile regions and
``flex_attention`` reach the backend as higher-order ops whose bodies are graphs of their own;
``torch.func`` transforms and ``autograd.Function`` are traced through. The ops around them run
on ORT (each case has some, and the test checks ORT ran); the higher-order ops run in PyTorch,
and the bodies PyTorch calls on plain tensors (``cond``'s branches, ``while_loop``'s functions,
``map``'s and ``scan``'s functions, a nested compile region) are lowered like any graph: their
regions run on ORT.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers import assert_close, assert_ran_on_ort, compile_ort, tiered
from ort_lazy.debug.records import recording
from ort_lazy.reasons import Reason


def _cond(x: torch.Tensor) -> torch.Tensor:
    y = torch.cond(x.sum() > 0, lambda a: (a.sin() * 2).relu(), lambda a: a.cos() - 1, (x * 3,))
    return y.exp() + x


def _cond_other_branch(x: torch.Tensor) -> torch.Tensor:
    return _cond(-x.abs())


def _while(x: torch.Tensor) -> torch.Tensor:
    from torch._higher_order_ops.while_loop import while_loop

    def keep_going(i: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return i < 3

    def body(i: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i + 1, a * 1.5 + 1

    return while_loop(keep_going, body, (torch.tensor(0), x.tanh()))[1] * 2


def _map(x: torch.Tensor) -> torch.Tensor:
    from torch._higher_order_ops.map import map as hop_map

    return hop_map(lambda row: row.tanh() + 1, x.sigmoid()) * x


def _scan(x: torch.Tensor) -> torch.Tensor:
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(lambda a, b: a * b + a, x.sigmoid(), 0, combine_mode="generic").log1p()


def _scan_rnn(x: torch.Tensor) -> torch.Tensor:
    from torch._higher_order_ops.scan import scan

    def step(h: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(h @ torch.full((8, 8), 0.1) + xt)
        return h, h * 2

    h, ys = scan(step, x[:2].sin(), x.reshape(4, 2, 8))
    return ys.sin() + h


@torch.compiler.nested_compile_region
def _block(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(a @ w) + 1


def _nested(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _block(x, w) + _block(x.sin(), w)


def _flex(x: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    q = (x * 0.5).reshape(1, 2, 4, 8)
    return flex_attention(q, q.cos(), q.sin())


def _vmap(x: torch.Tensor) -> torch.Tensor:
    return torch.vmap(lambda row: (row.sin() * row).sum())(x * 2)


def _grad(x: torch.Tensor) -> torch.Tensor:
    return torch.func.grad(lambda r: (r.sin() * r).sum())(x)


def _jacrev(x: torch.Tensor) -> torch.Tensor:
    return torch.func.jacrev(lambda r: r.sin() * r.sum())(x[0])


class _Exp2(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, a: torch.Tensor) -> torch.Tensor:
        out = a.exp() * 2
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad * out


def _autograd_function(x: torch.Tensor) -> torch.Tensor:
    return _Exp2.apply(x.tanh()) * x


CASES: dict[str, Callable[..., torch.Tensor]] = {
    "cond": _cond,
    "cond_other_branch": _cond_other_branch,
    "while_loop": _while,
    "map": _map,
    "associative_scan": _scan,
    "scan": _scan_rnn,
    "nested_compile_region": _nested,
    "flex_attention": _flex,
    "vmap": _vmap,
    "func_grad": _grad,
    "jacrev": _jacrev,
    "autograd_function": _autograd_function,
}

#: cases whose gradients are checked too (the others' higher-order ops have no autograd
#: support in eager PyTorch on the CPU, or are transforms already computing a gradient)
TRAINED = ("cond", "cond_other_branch", "nested_compile_region", "scan", "autograd_function", "vmap")


#: an op that only the body of the case's higher-order op has: a region on ORT holds it
BODY_OPS = {
    "cond": "aten.sin",
    "cond_other_branch": "aten.cos",
    "while_loop": "aten.lt",
    "map": "aten.tanh",
    "scan": "aten.mm",
    "nested_compile_region": "aten.mm",
}


def _regions_with(records: list, op: str) -> list[str]:
    return [r["name"] for g in records for r in g.regions if r["on_ort"] and any(o.startswith(op + ".") for o in r["ops"])]


def _inputs(name: str) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    return (x, torch.randn(8, 8) * 0.3) if name == "nested_compile_region" else (x,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_matches_eager(name: str) -> None:
    fn = CASES[name]
    inputs = _inputs(name)
    expected = fn(*inputs)
    with recording() as records:
        actual = compile_ort(fn)(*inputs)
    assert_close(actual, expected)
    assert_ran_on_ort()
    if name in BODY_OPS:
        assert _regions_with(records, BODY_OPS[name]), [(g.tag, g.regions) for g in records]
        tags = [g.tag for g in records]  # a body called twice is lowered (and listed) once
        assert len(tags) == len(set(tags)), tags


@pytest.mark.parametrize("name", tiered(TRAINED, 2))
def test_gradients_match_eager(name: str) -> None:
    fn = CASES[name]
    ref = [t.clone().requires_grad_() for t in _inputs(name)]
    fn(*ref).square().sum().backward()
    ours = [t.clone().requires_grad_() for t in _inputs(name)]
    with recording() as records:
        out = compile_ort(fn)(*ours)
        out.square().sum().backward()
    assert_close(out.detach(), fn(*ref).detach())
    for mine, theirs in zip(ours, ref):
        assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)
    assert_ran_on_ort(2)
    if name in ("nested_compile_region", "scan"):  # the body's forward and backward graphs
        assert len(_regions_with(records, "aten.mm")) >= 2, [(g.tag, g.regions) for g in records]


def test_explain_lists_the_higher_order_ops_and_their_graphs() -> None:
    import ort_lazy

    report = ort_lazy.explain(lambda x: _map(_cond(x)), torch.randn(8, 8))
    text = str(report)
    assert "PyTorch  higher_order.cond" in text and "PyTorch  higher_order.map_impl" in text, text
    for body in ("true_graph_0", "false_graph_0", "body_graph_0"):
        assert f"ORT      inference_{body}_fused_0" in text, text
    ops = [op for g in report.as_dict()["graphs"] for s in g["steps"] if s["where"] == "pytorch" for op in s["ops"]]
    assert [op["op"] for op in ops] == ["higher_order.cond", "higher_order.map_impl"], ops
    assert all(op["reason"] == Reason.HIGHER_ORDER for op in ops), ops


class _EncoderBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)

    @torch.compiler.nested_compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_encoder_fast_path_inside_a_nested_region_runs_on_ort() -> None:
    """Under no_grad, a TransformerEncoderLayer takes PyTorch's fused fast path, which ort-lazy
    lowers to ops ORT runs; in a nested compile region's body too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(_EncoderBlock(), _EncoderBlock()).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad(), recording() as records:
        expected = model(x)
        actual = compile_ort(model)(x)
    assert_close(actual, expected)
    assert_ran_on_ort()
    left = [op for g in records for op, reason in g.ops if reason is not None and "transformer_encoder" in op]
    assert not left, left
    body_regions = [r["name"] for g in records if "subgraph" in g.tag for r in g.regions if r["on_ort"]]
    assert body_regions, [(g.tag, g.regions) for g in records]


def test_bodies_without_a_fast_path_are_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Looking for the encoder fast path in a graph's bodies copies only a body that holds one
    (a body without it is the graph's own object afterwards, at any depth, and no graph was
    copied)."""
    import copy

    from ort_lazy.lowering.fast_paths import lower_fast_paths

    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda value, *a, **k: copies.append(value) or real(value, *a, **k))

    inner = torch.fx.symbolic_trace(lambda x: x.sin())
    middle = torch.fx.symbolic_trace(lambda x: x.cos())
    middle.add_submodule("inner", inner)
    outer = torch.fx.symbolic_trace(lambda x: x + 1)
    outer.add_submodule("body", middle)
    assert lower_fast_paths(outer) == 0
    assert outer.body is middle and middle.inner is inner
    assert not copies

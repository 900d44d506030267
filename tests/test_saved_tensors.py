"""What a training graph's forward region hands to the backward: no copies ORT must make.

Every saved tensor is an output of a forward ORT region, which ORT writes into a buffer of its
own. A saved tensor that is only a transposed weight, or a second (detached) name of another
saved activation, is a copy eager never makes: these tests train real layer mixes, check the
gradients against eager, and check that no forward region output is such a copy.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
import torch.fx
from torch import nn

from helpers import assert_ran_on_ort, aten_graph, train_parity
from ort_lazy import _compat
from ort_lazy.lowering import aten
from ort_lazy.lowering.joint import _WHOLE_VIEWS, _plain_clone, partition, simplify_joint, views_to_backward
from ort_lazy.models import MLP


def _view_copies(forward: torch.fx.GraphModule) -> list[str]:
    """Outputs of a forward graph that are only views of a graph input or of another output, or
    plain clones of another output: tensors ORT would write out again."""
    output = next(n for n in forward.graph.nodes if n.op == "output")
    outputs = [a for a in output.args[0] if isinstance(a, torch.fx.Node)]
    found = []
    for node in outputs:
        value = node
        while value.op == "call_function" and (value.target in _WHOLE_VIEWS or _plain_clone(value)):
            value = value.args[0]
            if value.op == "placeholder" or (value in outputs and value is not node):
                found.append(f"{node.name} <- {value.name}")
                break
    return found


def _train_capturing(make: Any, inputs: tuple[torch.Tensor, ...], split: Any = partition) -> list[torch.fx.GraphModule]:
    """``train_parity`` for two steps, ``split`` partitioning the joint graphs; returns the
    forward graphs."""
    forwards: list[torch.fx.GraphModule] = []

    def capturing(*args: object, **kwargs: object) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        fw, bw = split(*args, **kwargs)
        forwards.append(fw)
        return fw, bw

    with mock.patch.object(aten, "partition", capturing):
        train_parity(make, inputs, steps=2)
    return forwards


class _Explicit(nn.Module):
    """Weights used transposed and permuted by hand, around ReLU, GELU and a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 12) * 0.2)
        self.v = nn.Parameter(torch.randn(4, 3, 12) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ self.w.t())  # [n, 16]
        g = torch.nn.functional.gelu(h[:, :12] @ self.v.permute(2, 0, 1).reshape(12, 12))
        return g + x


_MODELS = {
    "mlp": (lambda: MLP(width=32, depth=3, out=5), lambda: (torch.randn(6, 32),)),
    "linear-no-bias": (lambda: nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU(), nn.Linear(8, 3, bias=False)), lambda: (torch.randn(4, 8),)),
    "explicit-transposes": (_Explicit, lambda: (torch.randn(5, 12),)),
    "transformer": (
        lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True),
        lambda: (torch.randn(2, 5, 16),),
    ),
    "dropout-0": (
        lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 8), nn.Dropout(0.0), nn.Linear(8, 2)),
        lambda: (torch.randn(4, 8),),
    ),
    "conv-relu": (
        lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)),
        lambda: (torch.randn(2, 3, 8, 8),),
    ),
}


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_forward_regions_save_no_copies(name: str) -> None:
    make, inputs = _MODELS[name]
    torch.manual_seed(0)
    forwards = _train_capturing(make, inputs())
    assert_ran_on_ort(4)
    assert forwards, "no training graph was partitioned"
    for forward in forwards:
        assert _view_copies(forward) == [], forward.code


def test_copy_detector_sees_copies() -> None:
    """The check above can fail: the default partition saves views of weights and activations."""
    torch.manual_seed(0)
    make, inputs = _MODELS["mlp"]
    forwards = _train_capturing(make, inputs(), _compat.default_partition())
    found = [c for f in forwards for c in _view_copies(f)]
    assert any("<- primals" in c for c in found) and any("<- relu" in c for c in found), found


def _joint(fn: object, *shapes: tuple[int, ...]) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(*(torch.randn(s) for s in shapes))


def _targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_simplify_joint_points_uses_at_sources() -> None:
    def fn(w: torch.Tensor, x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.ops.aten.t(w)
        back = torch.ops.aten.t(t)  # = w
        a = torch.ops.aten.mm(x, back)
        d = torch.ops.aten.detach(torch.ops.aten.detach(a))  # = a
        b = torch.ops.aten.relu(d)
        q = torch.ops.aten.permute(torch.ops.aten.permute(p, [1, 2, 0]), [2, 0, 1])  # = p
        r = torch.ops.aten.permute(torch.ops.aten.permute(p, [1, 2, 0]), [1, 2, 0])  # not p
        s = torch.ops.aten.transpose(torch.ops.aten.transpose(p, 0, -1), 2, 0)  # = p
        return b + 1, q * 2, r * 2, s * 3, t

    gm = _joint(fn, (3, 3), (2, 3), (2, 3, 4))
    expected = fn(*(torch.randn(s) for s in ((3, 3), (2, 3), (2, 3, 4))))
    args = [torch.randn(s) for s in ((3, 3), (2, 3), (2, 3, 4))]
    before = gm(*args)
    assert simplify_joint(gm) == 5  # the outer detach's input, then the relu's
    after = gm(*args)
    for a, b in zip(after, before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert mm.args[1] is placeholders[0]  # t(t(w)) -> w
    assert relu.args[0] is mm  # detach(detach(a)) -> a
    muls = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    assert muls[0].args[0] is placeholders[2]  # inverse permutes -> p
    assert muls[1].args[0] is not placeholders[2]  # a permute applied twice is not p
    assert muls[2].args[0] is placeholders[2]  # transposes that cancel
    # the graph's outputs are left as they were (AOTAutograd knows how they alias)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    assert output.args[0][-1].target is torch.ops.aten.t.default
    assert len(expected) == len(after)


def test_simplify_joint_leaves_graphs_without_chains() -> None:
    gm = _joint(lambda x, w: torch.relu(x @ w.t()), (2, 3), (4, 3))
    before = _targets(gm)
    assert simplify_joint(gm) == 0
    assert _targets(gm) == before


def test_simplify_joint_skips_clones_of_computed_values_only() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        r = torch.ops.aten.relu(x)
        a = torch.ops.aten.clone(r) * 2  # -> r
        b = torch.ops.aten.clone(w) * 3  # a graph input may be written later: kept
        c = torch.ops.aten.clone(torch.ops.aten.t(r), memory_format=torch.contiguous_format) * 4  # new layout: kept
        return a, b, c

    gm = _joint(fn, (3, 3), (3, 3))
    args = [torch.randn(3, 3), torch.randn(3, 3)]
    before = gm(*args)
    assert simplify_joint(gm) == 1
    for x, y in zip(gm(*args), before):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    muls = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    assert muls[0].args[0].target is torch.ops.aten.relu.default
    assert muls[1].args[0].target is torch.ops.aten.clone.default
    assert muls[2].args[0].target is torch.ops.aten.clone.default


def test_simplify_joint_keeps_reads_of_inputs_written_later() -> None:
    """A detach of a graph input the graph then writes into (running statistics) is not
    pointed at the input: the read must see the value from before the write."""

    def fn(b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.mul(x, torch.ops.aten.detach(torch.ops.aten.detach(b)))
        torch.ops.aten.copy_(b, x)
        return y

    gm = _joint(fn, (3,), (3,))
    assert simplify_joint(gm) == 0
    mul = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    assert mul.args[1].target is torch.ops.aten.detach.default


def test_views_to_backward_keeps_the_graph_in_order() -> None:
    """A view chain read by the backward at two depths, the deeper view first (ALBERT's shared
    layers): every copy follows what it reads, and the partition still works."""

    def fn(primals: torch.Tensor, x: torch.Tensor, tangents: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v = torch.ops.aten.view(primals, [4, 2])
        vt = torch.ops.aten.t(v)
        y = torch.ops.aten.mm(torch.ops.aten.relu(x), v)  # forward output
        early = torch.ops.aten.mm(vt, tangents)  # the backward reads vt first ...
        late = torch.ops.aten.mul(v, 2.0)  # ... then v
        return y, early, late

    gm = _joint(fn, (8,), (3, 4), (4, 2))
    y = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            node.meta["partitioner_tag"] = "is_forward"
        if node is y:
            break
    args = [torch.randn(8), torch.randn(3, 4), torch.randn(4, 2)]
    before = gm(*args)
    assert views_to_backward(gm) == 2
    gm.graph.lint()  # every node after its inputs
    for a, b in zip(gm(*args), before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _ClonedThenWritten(nn.Module):
    """A buffer read through a clone, then written in place in the same forward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x @ self.w.t() * self.b.clone()).relu()
        self.b.mul_(2)
        return y * self.b


def test_clone_of_an_input_written_later_keeps_its_value() -> None:
    """The backward reads the clone's value (the buffer before the write), as eager does."""
    torch.manual_seed(0)
    train_parity(_ClonedThenWritten, (torch.randn(3, 4),), steps=2)
    assert_ran_on_ort(2)


def _copied_outputs(model_bytes: bytes) -> list[str]:
    """Outputs of an ONNX graph that an Identity copies from a value the graph computes."""
    import onnx

    graph = onnx.load_from_string(model_bytes).graph
    inputs = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    outputs = [o.name for o in graph.output]
    producers = {o: n for n in graph.node for o in n.output}
    return [
        name for name in outputs
        if (n := producers.get(name)) is not None and n.op_type == "Identity"
        and n.input[0] not in inputs and n.input[0] not in outputs and n.input[0] in producers
    ]


@pytest.mark.parametrize("name", ["transformer", "explicit-transposes", "dropout-0"])
def test_onnx_regions_return_computed_values_without_a_copy(name: str) -> None:
    """A saved ``clone`` (the attention's contiguous query, key and value) is returned as the
    value it copies: ORT writes each once. Gradients are eager's (``train_parity``)."""
    from helpers import captured_exports

    make, inputs = _MODELS[name]
    torch.manual_seed(0)
    with captured_exports() as models:
        train_parity(make, inputs(), steps=2)
    assert_ran_on_ort(4)
    assert models
    for model in models:
        assert _copied_outputs(model.model_bytes) == [], model.name


def test_copy_check_sees_copied_outputs() -> None:
    """The check above can fail: without the rewrite the transformer's forward returns copies."""
    from helpers import captured_exports
    from ort_lazy.export import fx

    make, inputs = _MODELS["transformer"]
    torch.manual_seed(0)
    with mock.patch.object(fx, "_uncopied_outputs", lambda model: 0), captured_exports() as models:
        train_parity(make, inputs(), steps=1)
    assert any(_copied_outputs(m.model_bytes) for m in models)


def test_uncopied_outputs_keep_copies_of_inputs_and_of_repeated_values() -> None:
    """An input returned as is, and one computed value returned twice, keep a copy per output
    (each output is its own buffer); ORT returns the right values for all."""
    import onnxruntime as ort

    from ort_lazy.export.fx import export_graph

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return x.clone(), y.clone(), y.clone(), y + 1

    x = torch.randn(3, 4)
    model = export_graph(aten_graph(fn, x), "copies")
    import onnx

    graph = onnx.load_from_string(model.model_bytes).graph
    copies = [n.input[0] for n in graph.node if n.op_type == "Identity" and n.output[0] in {o.name for o in graph.output}]
    y = next(n.output[0] for n in graph.node if n.op_type == "Mul")
    assert sorted(copies) == sorted([model.input_names[0], y]), copies  # x's copy, y's second copy
    session = ort.InferenceSession(model.model_bytes, providers=["CPUExecutionProvider"])
    got = session.run(None, {model.input_names[0]: x.numpy()})
    for g, e in zip(got, fn(x)):
        assert torch.equal(torch.from_numpy(g), e)
    assert len({g.ctypes.data for g in got}) == 4

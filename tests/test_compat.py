"""The private torch APIs ort-lazy depends on, all behind ort_lazy._compat, exist and behave."""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ort_lazy import _compat


def test_supported_torch_version():
    assert _compat.torch_version() in _compat.SUPPORTED_TORCH
    _compat.check_torch_version()
    assert _compat.unsupported_torch_message() is None


def test_supported_torch_is_a_consecutive_range():
    """SUPPORTED_TORCH is what the declared ranges are derived from: oldest first, one minor
    after another, so ``>=oldest,<newest+1`` admits exactly the versions checked."""
    versions = _compat.SUPPORTED_TORCH
    assert versions == tuple(sorted(set(versions)))
    assert all(b == (a[0], a[1] + 1) for a, b in zip(versions, versions[1:])), versions
    (low_major, low_minor), (high_major, high_minor) = versions[0], versions[-1]
    assert _compat.supported_torch_range() == (f">={low_major}.{low_minor}", f"<{high_major}.{high_minor + 1}")


def test_torch_version_reads_local_and_prerelease_versions():
    assert _compat.torch_version("2.14.1+cu130") == (2, 14)
    assert _compat.torch_version("2.15.0a0+git7c78410") == (2, 15)
    assert _compat.torch_version("3.0.0") == (3, 0)


def _older_and_newer() -> tuple[str, str]:
    (low_major, low_minor), (high_major, high_minor) = _compat.SUPPORTED_TORCH[0], _compat.SUPPORTED_TORCH[-1]
    return f"{low_major}.{low_minor - 1}.0+cpu", f"{high_major}.{high_minor + 1}.0+cpu"


def test_unsupported_torch_message_names_the_supported_versions():
    older, newer = _older_and_newer()
    listed = ", ".join(f"{a}.{b}" for a, b in _compat.SUPPORTED_TORCH)
    for major, minor in _compat.SUPPORTED_TORCH:
        assert _compat.unsupported_torch_message(f"{major}.{minor}.1") is None
    old = _compat.unsupported_torch_message(older)
    new = _compat.unsupported_torch_message(newer)
    assert old is not None and f"torch {older} is older" in old and listed in old
    assert new is not None and f"torch {newer} is newer" in new and listed in new


def test_check_torch_version_refuses_older_and_warns_once_on_newer(monkeypatch):
    older, newer = _older_and_newer()
    monkeypatch.setattr(torch, "__version__", older)
    with pytest.raises(_compat.UnsupportedTorchError, match="older than ort-lazy supports"):
        _compat.check_torch_version()
    monkeypatch.setattr(torch, "__version__", newer)
    monkeypatch.setattr(_compat, "_warned_newer", False)
    with pytest.warns(_compat.UnsupportedTorchWarning, match=re.escape(f"torch {newer} is newer")):
        _compat.check_torch_version()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compat.check_torch_version()  # once per process: no second warning


def test_is_fake_tensor_on_this_torch():
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.randn(2)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(real)
    assert _compat.is_fake_tensor(fake)
    assert not _compat.is_fake_tensor(real) and not _compat.is_fake_tensor(torch.empty(2, device="meta"))
    assert not _compat.is_fake_tensor(3)


def test_is_fake_tensor_asks_torch_where_it_can_tell(monkeypatch):
    """torch >= 2.14 answers for fakes that are no FakeTensor (C++ fakes); before, the class
    is the test. Both branches, whichever torch runs."""
    from torch._subclasses import fake_tensor

    marked = torch.randn(2)
    monkeypatch.setattr(fake_tensor, "is_fake_tensor", lambda x: x is marked, raising=False)
    assert _compat.is_fake_tensor(marked) and not _compat.is_fake_tensor(torch.randn(2))
    monkeypatch.delattr(fake_tensor, "is_fake_tensor")
    with fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(2))
    assert _compat.is_fake_tensor(fake) and not _compat.is_fake_tensor(marked)
    if _compat.torch_version() >= (2, 14):
        monkeypatch.undo()
        assert callable(fake_tensor.is_fake_tensor)


def test_exporter_registry_lists_translated_overloads():
    ops = set(_compat.onnx_implemented_overloads())
    assert torch.ops.aten.mul.Tensor in ops and torch.ops.aten.addmm.default in ops


def test_custom_translations_register_and_see_the_tracer():
    """A translation registered through _compat is the registry's for that op; the exporter's
    tracer is None outside a translation (tests/test_polynomials.py runs translations that use it)."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    assert _compat.current_translation_tracer() is None

    def nextafter(x, other):
        return x

    registry = ONNXRegistry.from_torchlib()
    op = torch.ops.aten.nextafter.default
    assert not registry.is_registered(op)
    _compat.register_translation(registry, op, nextafter)
    assert registry.is_registered(op)
    assert any(meta.onnx_function is nextafter for meta in registry.get_decomps(op))


def test_library_translation_is_the_exporters_under_ort_lazys():
    """The exporter's own translation of an op ort-lazy translates too (its fallback), and None
    for an op the exporter does not translate."""
    from ort_lazy.export.activations import gelu
    from ort_lazy.export.translations import register_own_translations

    register_own_translations(_compat.onnx_registry())
    op = torch.ops.aten.gelu.default
    assert _compat.onnx_registry().get_decomps(op)[0].onnx_function is gelu
    library = _compat.library_translation(op)
    assert library is not None and library is not gelu
    assert _compat.library_translation(torch.ops.aten.nextafter.default) is None


def test_translate_fx_graph_keeps_symbolic_dims():
    import onnx_ir as ir
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    gm = make_fx(lambda x: torch.relu(x) * 2, tracing_mode="symbolic")(torch.randn(3, 4))
    del mode
    model = _compat.new_ir_model("t")
    _compat.translate_fx_graph(gm.graph, model)
    _compat.finalize_ir_model(model)
    proto = ir.serde.serialize_model(model)
    dims = [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert all(dims), dims  # both dims symbolic
    assert {n.op_type for n in proto.graph.node} >= {"Relu", "Mul"}


def test_translation_builds_one_op_signature_per_schema(monkeypatch):
    """While a graph is translated, the exporter gets one cached signature per ONNX schema
    (building one per emitted node was a quarter of the export time); the model is the same
    as without the cache, and outside a translation onnx_ir's own method is back."""
    import onnx
    import onnx_ir as ir

    cls = ir.schemas.OpSignature
    original = cls.__dict__["from_op_schema"]
    built: list[str] = []
    real = original.__func__
    monkeypatch.setattr(cls, "from_op_schema", classmethod(lambda k, schema: built.append(schema.name) or real(k, schema)))
    monkeypatch.setattr(_compat, "_SIGNATURES", {})
    gm = make_fx(lambda x: (torch.relu(x) * 2 + 1).relu() * 3)(torch.randn(3, 4))

    def translate() -> bytes:
        model = _compat.new_ir_model("t")
        _compat.translate_fx_graph(gm.graph, model)
        _compat.finalize_ir_model(model)
        return ir.serde.serialize_model(model).SerializeToString()

    cached = translate()
    assert sorted(built) == sorted(set(built)) and {"Relu", "Mul"} <= set(built), built  # once per schema
    built.clear()
    translate()
    assert built == []  # kept across translations
    with monkeypatch.context() as m:
        m.setattr(_compat, "cached_op_signatures", contextlib.nullcontext)
        assert translate() == cached
    assert len(built) > 4  # without the cache: one per node (two Relu, two Mul)
    first = cls.from_op_schema(onnx.defs.get_schema("Relu", 18))
    assert first is not cls.from_op_schema(onnx.defs.get_schema("Relu", 18))  # restored outside


def test_fake_mode_tracing_context_and_real_mode():
    mode = _compat.new_fake_mode()
    with mode:
        fake = torch.empty(2, 3)
    assert type(fake).__name__ == "FakeTensor"
    with _compat.tracing_context(mode):
        from torch._guards import detect_fake_mode

        assert detect_fake_mode() is mode
    real = torch.ones(2)
    with mode, _compat.real_tensor_mode():
        assert (real + 1).tolist() == [2.0, 2.0]


def _twice_plus_one(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_function_from_graph_and_fast_path_symbol():
    scripted = torch.jit.script(_twice_plus_one)
    fn = _compat.function_from_graph("f", scripted.graph.copy())
    assert fn(torch.ones(2)).tolist() == [3.0, 3.0]
    assert callable(_compat.transformer_encoder_fast_path())
    assert isinstance(_compat.lazy_backend_registered(), bool)


def _symbolic_fake(*shape: int) -> tuple[object, torch.Tensor]:
    """A fake mode with a shape environment and a fake tensor of symbolic ``shape``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return mode, mode.from_tensor(torch.randn(*shape), static_shapes=False)


def test_functionalize_keeps_symbolic_sizes_and_input_writes():
    """Python functionalization: ``linear`` of a 3-d input leaves its dims symbolic (no guard is
    added; ``torch.func.functionalize`` adds one per dim), in-place ops become functional and a
    write into an input is one ``copy_`` into it at the end."""
    def f(x: torch.Tensor, weight: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, weight)
        y.relu_()
        buf.add_(1)
        return y * 2

    mode, x = _symbolic_fake(2, 3, 4)
    weight, buf = mode.from_tensor(torch.randn(4, 4)), mode.from_tensor(torch.zeros(4))
    with mode, _compat.python_dispatcher(mode):
        gm = make_fx(_compat.functionalize(f))(x, weight, buf)
    assert not mode.shape_env.guards, mode.shape_env.guards
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.relu.default in targets and torch.ops.aten.relu_.default not in targets
    assert targets.count(torch.ops.aten.copy_.default) == 1 and targets[-1] == torch.ops.aten.copy_.default
    # the graph computes what f computes, and writes the input as f does
    real_x, real_weight, real_buf = torch.randn(5, 3, 4), torch.randn(4, 4), torch.zeros(4)
    expected = f(real_x, real_weight, torch.zeros(4))
    torch.testing.assert_close(gm(real_x, real_weight, real_buf), expected)
    assert real_buf.tolist() == [1.0] * 4


def test_functionalize_refuses_a_change_of_input_shape():
    def f(x: torch.Tensor) -> torch.Tensor:
        x.resize_(6)
        return x

    with pytest.raises(NotImplementedError, match="shape, strides or storage"):
        make_fx(_compat.functionalize(f))(torch.randn(2, 3))


def test_python_dispatcher_only_with_a_shape_environment():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert isinstance(_compat.python_dispatcher(FakeTensorMode()), contextlib.nullcontext)
    assert isinstance(_compat.python_dispatcher(None), contextlib.nullcontext)
    mode, _ = _symbolic_fake(2)
    with _compat.python_dispatcher(mode):
        assert torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)


def test_static_int_reads_numbers_and_constant_symbolic_ints():
    """``_compat.static_int``: ints as themselves, a symbolic int whose expression is a number
    (the element count of a (0, s0) batch) as that number, a free symbolic int as None."""
    seen = []

    def capture(gm, example_inputs):
        values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        seen.extend(v for v in values if isinstance(v, torch.Tensor))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda x, y: x.sum() + y.sum(), backend=capture, dynamic=True)(torch.zeros(0, 5), torch.zeros(3, 4))
    torch._dynamo.reset()
    empty, full = seen
    assert _compat.static_int(7) == 7
    assert not isinstance(empty.numel(), int) and _compat.static_int(empty.numel()) == 0
    assert _compat.static_int(full.numel()) is None


def _promotion_signature(gm: torch.fx.GraphModule) -> list[tuple[str, ...]]:
    """Every node's op, target, arguments and value types: what the type promotion pass writes."""
    out = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        types = [(str(getattr(v, "dtype", type(v).__name__)), str(tuple(getattr(v, "shape", ())))) for v in vals]
        out.append((n.op, str(n.target), str(n.args), str(n.kwargs), str(types)))
    return out


@pytest.mark.parametrize("real_value", [False, True], ids=["fake", "real-value"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_type_promotion_runs_only_what_it_promotes_and_writes_what_the_exporter_writes(symbolic, real_value, monkeypatch):
    """``insert_type_promotion`` re-runs only the nodes it promotes (a node it leaves keeps its
    value), and gives the graph and the values the exporter's own pass gives: mixed integer,
    float, half and 0-d operands, Python numbers, comparisons, a select, a reduction feeding a
    promoted op, in static and symbolic graphs. ``real_value``: a node whose value a rewrite
    wrote as a real tensor (ort-lazy's symbolic scalars do) is run again, not read."""
    import copy

    from torch.onnx._internal.exporter import _fx_passes

    def fn(i, f, h, d):
        a = i + f  # int64 + float32
        b = h * d  # float16 * float64 0-d
        c = torch.where(a > 0, a, h)  # float32 / float16 branches
        s = (i * 3).sum() / 2  # integer sum divided by a number
        e = torch.pow(h, 2) + torch.remainder(i, 3.5)
        return a, b, c, s + f, e, torch.atan2(i, f), (h < d).logical_and(i > 1)

    args = (torch.randint(-5, 5, (3, 4)), torch.randn(3, 4), torch.randn(4).half(), torch.tensor(2.5, dtype=torch.float64))
    gm = make_fx(fn, tracing_mode="symbolic" if symbolic else "fake")(*args)
    if real_value:  # the sum a promoted division reads
        total = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.sum.default)
        total.meta["val"] = torch.zeros((), dtype=torch.int64)
    expected = copy.deepcopy(gm)
    _fx_passes.insert_type_promotion_nodes(expected)
    assert len(expected.graph.nodes) > len(gm.graph.nodes)  # the case promotes something

    before = {n.name: (str(n.args), str(n.kwargs)) for n in gm.graph.nodes if n.op == "call_function"}
    runs: list[str] = []
    original = torch.fx.Interpreter.run_node

    def counting(self, n):
        runs.append(n.name)
        return original(self, n)

    monkeypatch.setattr(torch.fx.Interpreter, "run_node", counting)
    _compat.insert_type_promotion(gm)
    assert _promotion_signature(gm) == _promotion_signature(expected)
    unchanged = {n.name for n in gm.graph.nodes if before.get(n.name) == (str(n.args), str(n.kwargs))}
    rerun = {total.name} if real_value else set()
    assert rerun <= unchanged and rerun <= set(runs)
    unchanged -= rerun
    assert len(unchanged) >= 5 and not unchanged & set(runs), (unchanged, runs)  # nodes it left were not re-run
    assert set(runs) - unchanged  # the promoted and inserted ones were


def test_size_hint_reads_a_symbolic_size_without_a_guard() -> None:
    """The estimate ``partition`` sizes symbolic views by: the value the shape environment saw,
    and no guard added (the graph stays valid for every size)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.randn(6, 4), symbolic_context=context)
    numel = x.numel()
    assert isinstance(numel, torch.SymInt)
    assert _compat.size_hint(numel) == 24
    assert not shape_env.guards
    assert _compat.size_hint(7) == 7


def test_body_calling_ops_are_this_torchs_higher_order_ops() -> None:
    from torch._ops import HigherOrderOperator

    ops = _compat.body_calling_ops()
    assert torch.ops.higher_order.cond in ops and torch.ops.higher_order.invoke_subgraph in ops
    assert all(isinstance(op, HigherOrderOperator) for op in ops) and len(ops) == 5


def test_aot_graphs_say_which_outputs_their_caller_reads() -> None:
    """AOTAutograd's output descriptors: a forward graph's user output and the base of an
    output that views an intermediate are read by the caller, the tensors saved for backward
    are not; a graph without descriptors gives None."""
    from torch._dynamo.backends.common import aot_autograd

    seen: dict[str, list[bool] | None] = {}

    def compiler(tag: str):
        def compile_(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
            seen[tag] = _compat.returned_in_traced_layout(output)
            return gm

        return compile_

    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        y = (x @ w).relu()
        return y.sum(), y.t()  # y.t(): a view of an intermediate, regenerated from its base

    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    torch._dynamo.reset()
    total, _ = torch.compile(fn, backend=aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward")))(x, w)
    total.backward()
    # the sum, the transposed value's base; then the two tensors the backward reads
    assert seen["forward"] == [True, True, False, False], seen
    assert not any(seen["backward"] or []), seen  # gradients: laid out by autograd
    graph = torch.fx.symbolic_trace(lambda a: (a + 1, a * 2))
    assert _compat.returned_in_traced_layout(next(n for n in graph.graph.nodes if n.op == "output")) is None


def test_layout_queries():
    """``dense_layout`` and ``memory_format_of``: what the rewrites read to give their results
    eager's strides."""
    x = torch.randn(2, 3, 4, 5)
    assert _compat.dense_layout(x) and _compat.dense_layout(x.permute(0, 2, 3, 1))
    assert not _compat.dense_layout(x[:, :, ::2]) and not _compat.dense_layout(torch.randn(3, 1).expand(3, 4))
    assert _compat.memory_format_of(x) == torch.contiguous_format
    assert _compat.memory_format_of(x.contiguous(memory_format=torch.channels_last)) == torch.channels_last
    assert _compat.memory_format_of(x.permute(0, 2, 1, 3)) == torch.contiguous_format

"""onnxruntime bugs ort-lazy works around (``ort_lazy.runtime.quirks``): each bug is checked to
still exist, so the suite says when an onnxruntime release fixes it (then the workaround can go)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from helpers import assert_close, assert_ran_on_ort, aten_graph, captured_exports, compile_ort, train_parity
from ort_lazy.runtime.flavour import max_ir_version
from ort_lazy.runtime.kernel_fixes import KERNEL_FIXES_FACT, kernel_fixes
from ort_lazy.runtime.known_bugs import (
    AVERAGE_POOL_PADDED_DIVISOR,
    INT64_REDUCTIONS_IN_DOUBLE_SINCE,
    NOT_WHERE_FUSION_SINCE,
    OPENVINO_REDUCE_MAX_LOWEST,
    POOL_CEIL_EXTRA_WINDOW,
    has_bug,
)
from ort_lazy.runtime.quirks import (
    DOUBLE_LOG_SOFTMAX_NAN,
    MATMUL_TRANSPOSE_FUSION,
    MATMUL_TRANSPOSES_FACT,
    NOT_WHERE_FUSION,
    SIGMOID_APPROXIMATION,
    SKIP_LAYER_NORM_FUSION,
    WHERE_DROPS_NEGATIVE_ZERO,
    _exact_sigmoids,
    disabled_optimizers,
    exact_sigmoid,
    fuse_matmul_transposes,
)


def _model(graph: onnx.GraphProto, **kwargs: object) -> onnx.ModelProto:
    """``helper.make_model`` at the newest IR version the installed onnxruntime loads."""
    model = helper.make_model(graph, **kwargs)
    model.ir_version = min(model.ir_version, max_ir_version())
    return model


def _transposed_matvec() -> bytes:
    nodes = [helper.make_node("Transpose", ["A"], ["At"], perm=[1, 0]), helper.make_node("MatMul", ["At", "v"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [5, 4]), helper.make_tensor_value_info("v", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    return _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def _run(model: bytes, **kwargs: object) -> float:
    rng = np.random.default_rng(0)
    a, v = rng.standard_normal((5, 4), dtype=np.float32), rng.standard_normal(5, dtype=np.float32)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"], **kwargs)
    return float(np.abs(session.run(None, {"A": a, "v": v})[0] - a.T @ v).max())


def test_matmul_transpose_fusion_with_a_vector_is_still_wrong_in_this_onnxruntime() -> None:
    error = _run(_transposed_matvec())
    assert error > 1e-3, (
        f"onnxruntime {ort.__version__} computes MatMul(Transpose(A), v) right with MatmulTransposeFusion on "
        f"(error {error}): the workaround in ort_lazy.runtime.quirks may go for this version"
    )


def test_without_the_fusion_it_is_right_and_ort_lazy_turns_it_off_for_such_models() -> None:
    model = _transposed_matvec()
    assert _run(model, disabled_optimizers=[MATMUL_TRANSPOSE_FUSION]) < 1e-5
    assert disabled_optimizers(model) == [MATMUL_TRANSPOSE_FUSION]


def test_models_without_vector_products_keep_every_optimizer() -> None:
    nodes = [helper.make_node("Transpose", ["A"], ["At"], perm=[1, 0]), helper.make_node("MatMul", ["At", "B"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [5, 4]), helper.make_tensor_value_info("B", TensorProto.FLOAT, [5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
    )
    model = _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    assert disabled_optimizers(model) == []
    assert disabled_optimizers(b"no matrix products here") == []


#: name -> (transposed input's shape, perm, other operand's shape, whether the Transpose feeds B)
_PRODUCTS = {
    "slow": ((256, 64), [1, 0], (256, 512), False),  # [k, m]^T @ [k, n], n >= k, 8.4M multiply-adds
    "transB": ((16, 32), [1, 0], (2, 8, 32), True),  # x @ W^T
    "batched": ((4, 8, 16), [0, 2, 1], (4, 8, 16), False),  # attention's gradient: batched transA
    "small": ((8, 4), [1, 0], (8, 8), False),  # a 2-D transA too small to be slow
    "narrow": ((512, 64), [1, 0], (512, 256), False),  # n < k: the Transpose costs more than it saves
    "vector": ((5, 4), [1, 0], (5,), False),  # a 1-D operand: never fused (MATMUL_TRANSPOSE_FUSION)
}


def _transposed_products(elem_type: int = TensorProto.FLOAT, names: tuple[str, ...] = tuple(_PRODUCTS)) -> bytes:
    nodes, inputs, outputs = [], [], []
    for name in names:
        shape, perm, other, feeds_b = _PRODUCTS[name]
        nodes.append(helper.make_node("Transpose", [f"{name}_t"], [f"{name}_tt"], perm=perm))
        pair = [f"{name}_o", f"{name}_tt"] if feeds_b else [f"{name}_tt", f"{name}_o"]
        nodes.append(helper.make_node("MatMul", pair, [f"{name}_y"], name=name))
        inputs += [helper.make_tensor_value_info(f"{name}_t", elem_type, shape), helper.make_tensor_value_info(f"{name}_o", elem_type, other)]
        outputs.append(helper.make_tensor_value_info(f"{name}_y", elem_type, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def _products_feeds() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    feeds, want = {}, {}
    for name, (shape, perm, other, feeds_b) in _PRODUCTS.items():
        t, o = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(other, dtype=np.float32)
        feeds[f"{name}_t"], feeds[f"{name}_o"] = t, o
        want[f"{name}_y"] = o @ t.transpose(perm) if feeds_b else t.transpose(perm) @ o
    return feeds, want


def test_cpu_models_keep_their_slow_transposed_products_unfused(tmp_path: Path) -> None:
    """A model holding a large 2-D ``MatMul(Transpose(a), b)`` (a weight gradient, slow as
    FusedMatMul on the CPU: ``quirks.TRANSPOSED_A_MATMUL``) gets ORT's other transpose fusions
    written in and runs without MatmulTransposeFusion: that product stays a Transpose and a
    MatMul in the optimized model, every product matches numpy."""
    model = _transposed_products()
    rewritten, off = fuse_matmul_transposes(model)
    assert off
    graph = onnx.load_from_string(rewritten).graph.node
    nodes = {n.name: n for n in graph if n.name}
    flags = {n.name: {a.name: a.i for a in n.attribute if a.name.startswith("trans")} for n in nodes.values()}
    assert nodes["slow"].op_type == "MatMul" and nodes["narrow"].op_type == "FusedMatMul"
    assert flags["transB"] == {"transB": 1} and list(nodes["transB"].input) == ["transB_o", "transB_t"]
    assert flags["batched"] == {"transA": 1} and flags["small"] == {"transA": 1} and flags["narrow"] == {"transA": 1}
    assert nodes["vector"].op_type == "MatMul"
    transposes = [n.input[0] for n in graph if n.op_type == "Transpose"]
    assert sorted(transposes) == ["slow_t", "vector_t"]  # the others' are gone
    disabled = disabled_optimizers(rewritten, transposed_a=off)
    assert MATMUL_TRANSPOSE_FUSION in disabled
    small = _transposed_products(names=("small",))
    assert MATMUL_TRANSPOSE_FUSION not in disabled_optimizers(small, transposed_a=fuse_matmul_transposes(small)[1])
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(rewritten, so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    feeds, want = _products_feeds()
    for name, got in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-4)
    optimized = onnx.load(str(tmp_path / "optimized.onnx")).graph.node
    producers = {out: n for n in optimized for out in n.output}
    slow = next(n for n in optimized if "slow_y" in n.output)
    assert slow.op_type == "MatMul" and producers[slow.input[0]].op_type == "Transpose"


def test_models_without_slow_transposed_products_are_left_to_ort() -> None:
    """Small, narrow or non-float products, and models for other providers, keep ORT's fusion
    (the model comes back unchanged)."""
    for name in ("small", "narrow", "transB", "batched", "vector"):
        model = _transposed_products(names=(name,))
        assert fuse_matmul_transposes(model) == (model, False), name
    model = _transposed_products()
    assert fuse_matmul_transposes(model, ("CUDAExecutionProvider", "CPUExecutionProvider")) == (model, False)
    double = _transposed_products(TensorProto.DOUBLE)
    assert fuse_matmul_transposes(double) == (double, False)
    unreadable = b"Transpose MatMul, but no model"  # a speed rewrite never fails a session
    assert fuse_matmul_transposes(unreadable) == (unreadable, False)


def test_a_linear_layers_weight_gradient_runs_unfused_and_right(tmp_path: Path) -> None:
    """The weight gradient of a 256 -> 512 linear layer over 64 tokens is such a product: the
    backward graph's export says so (once, as a fact), its session keeps the product unfused, and
    training matches eager."""
    path = tmp_path / "optimized.onnx"
    with captured_exports() as models:
        train_parity(
            lambda: torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh()),
            [torch.randn(64, 256)],
            session_options={"optimized_model_filepath": str(path)},
        )
    assert_ran_on_ort()
    assert sorted(m.facts.get(MATMUL_TRANSPOSES_FACT) for m in models) == [False, True]
    optimized = onnx.load(str(path)).graph.node  # the backward's session is the last one opened
    producers = {out: n for n in optimized for out in n.output}
    assert any(
        n.op_type == "MatMul" and n.input[0] in producers and producers[n.input[0]].op_type == "Transpose"
        for n in optimized
    ), [n.op_type for n in optimized]
    assert not any(
        n.op_type == "FusedMatMul" and any(a.name == "transA" and a.i for a in n.attribute) for n in optimized
    )


def _int64_reduction(op: str) -> ort.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], keepdims=0)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [])],
    )
    model = _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_int64_reduce_sum_and_prod_go_through_double_in_the_versions_said() -> None:
    """ort-lazy lowers int64/int32 sum to CumSum and prod to a tree of Mul on every version
    (``ort_lazy.lowering.reductions.integer_sum`` / ``integer_prod``; tested in test_correctness)."""
    x = np.array([2**53 + 1, 2], dtype=np.int64)
    got_sum = int(_int64_reduction("ReduceSum").run(None, {"x": x})[0])
    got_prod = int(_int64_reduction("ReduceProd").run(None, {"x": x})[0])
    inexact = got_sum != 2**53 + 3 and got_prod != (2**53 + 1) * 2
    assert inexact == has_bug(INT64_REDUCTIONS_IN_DOUBLE_SINCE), (
        f"onnxruntime {ort.__version__} {'rounds' if inexact else 'sums and multiplies'} int64 "
        f"{'through double' if inexact else 'exactly'}: INT64_REDUCTIONS_IN_DOUBLE_SINCE says otherwise"
    )


def _selection(nodes: list) -> bytes:
    """A model of ``nodes`` from a bool ``c`` and floats ``x``, ``y`` (2 elements) to ``z``."""
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, [2]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    return _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_where_still_drops_the_sign_of_a_negative_zero_from_its_first_branch() -> None:
    """ort-lazy's copysign multiplies by +-1 instead (tested in test_correctness, signed zeros)."""
    model = _selection([helper.make_node(WHERE_DROPS_NEGATIVE_ZERO, ["c", "x", "y"], ["z"])])
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    c = np.array([True, False])
    z = session.run(None, {"c": c, "x": np.array([-0.0, 1.0], np.float32), "y": np.array([2.0, -0.0], np.float32)})[0]
    assert np.signbit(z[1]), "a -0.0 from the second branch lost its sign too"
    assert not np.signbit(z[0]), (
        f"onnxruntime {ort.__version__} keeps the sign of a -0.0 Where selects: WHERE_DROPS_NEGATIVE_ZERO can go"
    )


def test_not_where_fusion_moves_the_second_branch_first_in_the_versions_said_and_ort_lazy_turns_it_off() -> None:
    """``Where(Not(c), x, y)`` becomes ``Where(c, y, x)``: a -0.0 in ``y`` then comes from the
    first branch and loses its sign (WHERE_DROPS_NEGATIVE_ZERO)."""
    model = _selection([helper.make_node("Not", ["c"], ["n"]), helper.make_node("Where", ["n", "x", "y"], ["z"])])
    feeds = {"c": np.array([True, False]), "x": np.array([1.0, 2.0], np.float32), "y": np.array([-0.0, 3.0], np.float32)}
    fused = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert (not np.signbit(fused[0])) == has_bug(NOT_WHERE_FUSION_SINCE), (
        f"onnxruntime {ort.__version__} {'drops' if not np.signbit(fused[0]) else 'keeps'} the sign through "
        "NotWhereFusion: NOT_WHERE_FUSION_SINCE says otherwise"
    )
    assert NOT_WHERE_FUSION in disabled_optimizers(model)
    kept = ort.InferenceSession(model, providers=["CPUExecutionProvider"], disabled_optimizers=[NOT_WHERE_FUSION]).run(None, feeds)[0]
    assert np.signbit(kept[0]) and kept[1] == 2.0


def _optimized_ops(model: bytes, path: str, **kwargs: object) -> set[str]:
    so = ort.SessionOptions()
    so.optimized_model_filepath = path
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"], **kwargs)
    return {n.op_type for n in onnx.load(path).graph.node}


def test_residual_layer_norm_is_fused_by_default_and_ort_lazy_keeps_it_unfused_on_cpu(tmp_path: Path) -> None:
    """SkipLayerNormFusion (a slow CPU kernel, see ``quirks.SKIP_LAYER_NORM_FUSION``) fires on a
    post-norm residual block by default; ort-lazy's CPU sessions run without it, with the same
    numbers as eager; other providers keep it."""
    def block(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x + y * 2.0, (32,))

    x, y = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    ours = tmp_path / "ours.onnx"
    with captured_exports() as models:
        out = compile_ort(block, session_options={"optimized_model_filepath": str(ours)})(x, y)
    assert_close(out, block(x, y))
    assert_ran_on_ort()
    model = models[0].model_bytes
    assert "SkipLayerNormalization" in _optimized_ops(model, str(tmp_path / "default.onnx"))
    ops = {n.op_type for n in onnx.load(str(ours)).graph.node}
    assert "LayerNormalization" in ops and "SkipLayerNormalization" not in ops, ops
    assert SKIP_LAYER_NORM_FUSION in disabled_optimizers(model)
    assert SKIP_LAYER_NORM_FUSION not in disabled_optimizers(model, ("CUDAExecutionProvider", "CPUExecutionProvider"))


_SIGMOID_ARGUMENTS = np.array([-120, -100, -88, -40, -30, -20, -17, -16, -15, -12, -10, -5, -1, -0.0, 0, 1, 5, 17, 30, 120])


def _sigmoid_model(elem_type: int, in_function: bool = False) -> bytes:
    """``y = Sigmoid(x)`` of ``elem_type`` (in a local function); bfloat16 between float32 edges
    (numpy has no bfloat16)."""
    opsets = [helper.make_opsetid("", 18)]
    functions = []
    edge = TensorProto.FLOAT if elem_type == TensorProto.BFLOAT16 else elem_type
    nodes = [helper.make_node("Cast", ["x"], ["a"], to=elem_type)]
    if in_function:
        functions.append(helper.make_function("local", "Logistic", ["a"], ["b"], [helper.make_node("Sigmoid", ["a"], ["b"])], opsets))
        opsets.append(helper.make_opsetid("local", 1))
        nodes.append(helper.make_node("Logistic", ["a"], ["b"], domain="local"))
    else:
        nodes.append(helper.make_node(SIGMOID_APPROXIMATION, ["a"], ["b"]))
    nodes.append(helper.make_node("Cast", ["b"], ["y"], to=edge))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", edge, None)], [helper.make_tensor_value_info("y", edge, None)]
    )
    return _model(graph, opset_imports=opsets, functions=functions).SerializeToString()


def _sigmoid_steps(model: bytes, dtype: torch.dtype) -> float:
    """The largest distance from float64 sigmoid, in steps of ``dtype``, of ``model`` on the CPU."""
    x = torch.tensor(_SIGMOID_ARGUMENTS, dtype=dtype)
    feed = (x.float() if dtype == torch.bfloat16 else x).numpy()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"x": feed})[0]).to(dtype).double()
    want = torch.sigmoid(x.double())
    # eager's own values are within a step or two; subnormal results count as one step
    step = (torch.finfo(dtype).eps * want.abs()).clamp(min=torch.finfo(dtype).tiny)
    return float(((got - want).abs() / step).max())


_ONNX_TYPES = {
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
}


def test_double_log_softmax_still_ignores_nan_in_this_onnxruntime() -> None:
    """ort-lazy lowers float64 log_softmax to eager's formula (tested in test_correctness, NaN
    and infinities)."""
    graph = helper.make_graph(
        [helper.make_node(DOUBLE_LOG_SOFTMAX_NAN, ["x"], ["y"], axis=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 4])],
    )
    model = _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    y = session.run(None, {"x": np.array([[1.0, np.nan, 2.0, 3.0]])})[0]
    assert not np.isnan(y[0, 0]), (
        f"onnxruntime {ort.__version__} gives a NaN row: DOUBLE_LOG_SOFTMAX_NAN and log_softmax_float64 can go"
    )


def test_cpu_sigmoid_is_still_an_absolute_approximation_in_this_onnxruntime() -> None:
    for dtype in (torch.float32, torch.float64):
        steps = _sigmoid_steps(_sigmoid_model(_ONNX_TYPES[dtype]), dtype)
        assert steps > 1e3, (
            f"onnxruntime {ort.__version__}'s {dtype} Sigmoid is within {steps} steps of sigmoid in the tails: "
            "quirks.exact_sigmoid may go for this version"
        )


def test_ort_lazy_replaces_every_sigmoid_on_the_cpu_provider() -> None:
    """Float types, half types computed in float32, inside a local function, of unknown type (a
    CastLike):
    each within four steps of the type everywhere on the CPU provider; other providers and
    models without a Sigmoid keep their bytes."""
    for dtype, elem in _ONNX_TYPES.items():
        untyped = onnx.load_from_string(_sigmoid_model(elem))
        assert _exact_sigmoids(untyped.graph, {}, [0]) == 1  # as if inference could not type x
        for model in (_sigmoid_model(elem), _sigmoid_model(elem, in_function=True), untyped.SerializeToString()):
            exact = exact_sigmoid(model)
            assert SIGMOID_APPROXIMATION not in {n.op_type for n in onnx.load_from_string(exact).graph.node}
            assert _sigmoid_steps(exact, dtype) <= 4, dtype
    model = _sigmoid_model(TensorProto.FLOAT)
    assert exact_sigmoid(model, ("CUDAExecutionProvider", "CPUExecutionProvider")) is model
    assert exact_sigmoid(_transposed_matvec()) == _transposed_matvec()


def test_silu_becomes_one_division() -> None:
    """``Mul(x, Sigmoid(x))`` (the translation of silu) becomes ``x / (1 + exp(-x))``: four
    passes, not five; a Sigmoid read elsewhere too keeps its own Reciprocal."""
    for dtype, elem in ((torch.float32, TensorProto.FLOAT), (torch.float16, TensorProto.FLOAT16)):
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
        value = lambda name, elem=elem: helper.make_tensor_value_info(name, elem, None)  # noqa: E731
        graph = helper.make_graph(nodes, "g", [value("x")], [value("y")])
        model = _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
        exact = onnx.load_from_string(exact_sigmoid(model))
        assert [n.op_type for n in exact.graph.node if n.op_type not in ("Cast", "Constant")] == ["Neg", "Exp", "Add", "Div"]
        x = torch.tensor(_SIGMOID_ARGUMENTS, dtype=dtype)
        got = torch.from_numpy(ort.InferenceSession(exact.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0])
        want = torch.nn.functional.silu(x.double())
        step = (torch.finfo(dtype).eps * want.abs()).clamp(min=torch.finfo(dtype).tiny)
        assert float(((got.double() - want).abs() / step).max()) <= 4
        graph.output.append(value("s"))  # the Sigmoid is read twice
        model = _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
        ops = [n.op_type for n in onnx.load_from_string(exact_sigmoid(model)).graph.node]
        assert "Reciprocal" in ops and "Mul" in ops and "Sigmoid" not in ops


def test_export_makes_cpu_sigmoids_exact_once() -> None:
    """A model exported for the CPU provider already has its Sigmoids rewritten (and says so), so
    opening a session, in this process or a warm one, need not parse it; one for CUDA keeps them."""
    from ort_lazy.export.fx import export_graph

    gm = aten_graph(lambda x: torch.nn.functional.silu(x) + torch.sigmoid(x * 2), torch.randn(4, 8))
    cpu = export_graph(gm)
    assert cpu.facts.get("exact_sigmoid") is True
    assert "Sigmoid" not in [n.op_type for n in onnx.load_from_string(cpu.model_bytes).graph.node]
    cuda = export_graph(gm, providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert "exact_sigmoid" not in cuda.facts
    assert "Sigmoid" in [n.op_type for n in onnx.load_from_string(cuda.model_bytes).graph.node]
    x = torch.tensor(_SIGMOID_ARGUMENTS, dtype=torch.float32)
    got = compile_ort(lambda t: torch.nn.functional.silu(t) + torch.sigmoid(t * 2))(x)
    assert_close(got, torch.nn.functional.silu(x) + torch.sigmoid(x * 2), rtol=1e-6, atol=0, scale=False)
    assert_ran_on_ort()


# --------------------------------------------------------------------- version-keyed kernel bugs

_OPENVINO = "OpenVINOExecutionProvider"
_HAS_OPENVINO = _OPENVINO in ort.get_available_providers()

#: name -> (op: "avg0"/"avg1" (count_include_pad) or "max", input shape, kernel, strides, pads per
#: spatial dim (both sides), ceil_mode)
_POOLS: dict[str, tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int]] = {
    # wrong on every version with AVERAGE_POOL_PADDED_DIVISOR (the pads differ between dims)
    "divisor": ("avg1", (1, 3, 9, 9), (6, 6), (3, 3), (2, 3), 1),
    # ceil windows passing the padded input (before 1.21, OpenVINO): ``divisor_override``'s case
    "divisor_ceil": ("avg1", (1, 3, 9, 9), (4, 4), (2, 3), (1, 1), 1),
    "divisor_no_ceil": ("avg1", (1, 1, 8, 8), (4, 4), (2, 2), (1, 0), 0),
    "divisor_no_pad": ("avg1", (1, 2, 5, 5), (2, 2), (2, 2), (0, 0), 1),
    # wrong on every version with POOL_CEIL_EXTRA_WINDOW: 8 rows, kernel 1, stride 3
    "extra_window": ("max", (1, 2, 8, 7), (1, 1), (3, 3), (0, 0), 1),
    "extra_window_average": ("avg0", (1, 2, 8, 7), (1, 2), (3, 3), (0, 1), 1),
    "extra_window_counted": ("avg1", (1, 2, 8, 5), (2, 2), (4, 2), (1, 1), 1),
    "pool1d": ("avg1", (2, 3, 10), (4,), (3,), (2,), 1),
    "pool3d": ("avg1", (1, 1, 5, 6, 7), (2, 3, 2), (2, 2, 3), (1, 1, 0), 1),
    "max3d": ("max", (1, 1, 7, 6, 5), (1, 2, 2), (3, 2, 2), (0, 1, 1), 1),
    "plain": ("avg1", (1, 2, 8, 8), (3, 3), (1, 1), (1, 1), 0),
}


def _pool_model(name: str) -> bytes:
    op, shape, kernel, strides, pads, ceil = _POOLS[name]
    attrs: dict[str, object] = {"kernel_shape": list(kernel), "strides": list(strides), "pads": [*pads, *pads], "ceil_mode": ceil}
    if op != "max":
        attrs["count_include_pad"] = int(op == "avg1")
    node = helper.make_node("MaxPool" if op == "max" else "AveragePool", ["x"], ["y"], name=name, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    return _model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


def _pool_error(name: str, model: bytes, provider: str = "CPUExecutionProvider") -> float:
    """How far ORT's result of ``model`` (pooling ``name``) is from PyTorch's (inf: another shape)."""
    op, shape, kernel, strides, pads, ceil = _POOLS[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    pool = getattr(torch.nn.functional, f"{'max' if op == 'max' else 'avg'}_pool{len(kernel)}d")
    extra = {} if op == "max" else {"count_include_pad": op == "avg1"}
    want = pool(x, kernel, strides, pads, ceil_mode=bool(ceil), **extra).numpy()
    got = ort.InferenceSession(model, providers=[provider]).run(None, {"x": x.numpy()})[0]
    return float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")


def test_pooling_kernel_bugs_are_where_the_quirks_say() -> None:
    """Each pooling bug shows on the CPU provider (and OpenVINO's, where installed) exactly in the
    versions :data:`POOL_CEIL_EXTRA_WINDOW` and :data:`AVERAGE_POOL_PADDED_DIVISOR` name."""
    providers = ["CPUExecutionProvider"] + ([_OPENVINO] if _HAS_OPENVINO else [])
    for provider in providers:
        for name, bug in (("divisor", AVERAGE_POOL_PADDED_DIVISOR), ("extra_window", POOL_CEIL_EXTRA_WINDOW)):
            wrong = _pool_error(name, _pool_model(name), provider) > 1e-5
            assert wrong == has_bug(bug, [provider]), (
                f"onnxruntime {ort.__version__} on {provider} {'gets' if wrong else 'no longer gets'} {name!r} "
                f"wrong: {bug.name} ({bug.versions}) says otherwise"
            )


def test_kernel_fixes_make_every_pooling_right_for_every_version_said() -> None:
    """The rewritten models (cut to PyTorch's shape, padding counted by a constant ratio) are
    right on the installed onnxruntime: written with every rewrite (for 1.19), for the installed
    version, and (where installed) for OpenVINO on OpenVINO's provider."""
    for name in _POOLS:
        model = _pool_model(name)
        for version in ((1, 19), None):  # (1, 19): every rewrite
            fixed = kernel_fixes(model, version=version)
            assert _pool_error(name, fixed) < 1e-5, (name, version)
        if _HAS_OPENVINO:
            fixed = kernel_fixes(model, (_OPENVINO, "CPUExecutionProvider"))
            assert _pool_error(name, fixed, _OPENVINO) < 1e-5, name
    # a session meeting no bug, or a model without a pooling concerned, keeps its bytes
    model = _pool_model("divisor")
    assert kernel_fixes(model, version=(1, 25)) is model
    plain = _pool_model("extra_window_average")
    assert kernel_fixes(plain, version=(1, 21)) is plain  # count_include_pad=0 and 1.21's shapes are right
    ops = [n.op_type for n in onnx.load_from_string(kernel_fixes(model, version=(1, 19))).graph.node]
    assert ops.count("AveragePool") == 1 and "Mul" in ops


def _untyped(model: bytes) -> list[str]:
    """The values of ``model``'s nodes with no element type and rank recorded."""
    proto = onnx.load_from_string(model)
    typed = {
        v.name
        for v in [*proto.graph.value_info, *proto.graph.output, *proto.graph.input]
        if v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape")
    }
    return [out for n in proto.graph.node for out in n.output if out and out not in typed]


def test_every_value_a_rewrite_adds_is_typed() -> None:
    """Readers that need every value typed (OpenVINO's, :class:`RegionForm.typed_values`) get the
    new values typed too: a model typed throughout stays so."""
    for name in _POOLS:
        model = onnx.load_from_string(_pool_model(name))
        model.graph.value_info.extend(model.graph.output)  # the output typed as well
        model = onnx.shape_inference.infer_shapes(model)
        assert _untyped(kernel_fixes(model.SerializeToString(), version=(1, 19))) == [], name
    model = onnx.shape_inference.infer_shapes(onnx.load_from_string(_reduce_max_model()))
    assert _untyped(model.SerializeToString()) == []
    assert _untyped(kernel_fixes(model.SerializeToString(), (_OPENVINO, "CPUExecutionProvider"))) == []


def test_kernel_fixes_refuse_a_pooling_of_unknown_shape_that_needs_them() -> None:
    """Without the input's spatial shape there is no ratio to apply: the export fails (the region
    runs in PyTorch) rather than ORT giving wrong numbers."""
    proto = onnx.load_from_string(_pool_model("divisor"))
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    with pytest.raises(ValueError, match="spatial shape is unknown"):
        kernel_fixes(proto.SerializeToString(), version=(1, 19))


def test_kernel_fixes_infer_a_shape_the_model_records_with_unknown_dims() -> None:
    """A value recorded with unknown dims (as a translator may write it) but whose shape follows
    from the inputs is inferred: the pooling it feeds is rewritten, not refused."""
    proto = onnx.load_from_string(_pool_model("extra_window_counted"))
    pool = proto.graph.node[0]
    pool.input[0] = "x_copy"
    proto.graph.node.insert(0, helper.make_node("Identity", ["x"], ["x_copy"]))
    proto.graph.value_info.append(helper.make_tensor_value_info("x_copy", TensorProto.FLOAT, ["n", "c", "h", "w"]))
    fixed = kernel_fixes(proto.SerializeToString(), version=(1, 19))
    assert _pool_error("extra_window_counted", fixed) < 1e-5


def test_ceil_mode_average_pooling_with_a_divisor_runs_right_on_ort() -> None:
    """``avg_pool2d(ceil_mode=True, divisor_override=2)`` (lowered to pooling with the padding
    counted) and ceil-mode average pooling, compiled: eager's numbers on the installed onnxruntime."""

    def pools(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.nn.functional
        return (
            f.avg_pool2d(x, (4, 4), (2, 3), 1, ceil_mode=True, count_include_pad=False, divisor_override=2),
            f.avg_pool2d(x, (6, 6), (3, 3), (2, 3), ceil_mode=True, count_include_pad=True, divisor_override=2),
            f.avg_pool2d(x, (6, 6), (3, 3), (2, 3), ceil_mode=True),
            f.avg_pool2d(x[:, :, :5, :5], 2, 2, ceil_mode=True),
            f.max_pool1d(x[0].half(), 3, 2, ceil_mode=True).float(),  # through the NaN rule, in float32
        )

    x = torch.randn(1, 3, 9, 9)
    with captured_exports() as models:
        got = compile_ort(pools)(x)
    for g, w in zip(got, pools(x)):
        assert_close(g, w)
    assert_ran_on_ort()
    assert all(m.facts.get(KERNEL_FIXES_FACT) for m in models)


def _reduce_max_model() -> bytes:
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("Constant", [], ["axes"], value=axes), helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])]
    )
    return _model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


_MAXIMA = np.array([[-np.inf] * 4, [1.0, -np.inf, 3.0, -2.0], [-3.4028235e38, -np.inf, -np.inf, -np.inf]], np.float32)


def test_openvino_reduce_max_of_negative_infinities_is_where_the_quirk_says_and_fixed() -> None:
    """OpenVINO's float32 ReduceMax of only -inf (:data:`OPENVINO_REDUCE_MAX_LOWEST`): the bug where
    installed, and the rewritten model right on every provider present."""
    model = _reduce_max_model()
    want = np.array([[-np.inf], [3.0], [-3.4028235e38]], np.float32)
    fixed = kernel_fixes(model, (_OPENVINO, "CPUExecutionProvider"))
    assert [n.op_type for n in onnx.load_from_string(fixed).graph.node].count("ReduceMax") == 2
    assert kernel_fixes(model) is model  # the CPU provider's ReduceMax is right
    for provider in ["CPUExecutionProvider"] + ([_OPENVINO] if _HAS_OPENVINO else []):
        raw = ort.InferenceSession(model, providers=[provider]).run(None, {"x": _MAXIMA})[0]
        assert (not np.array_equal(raw, want)) == has_bug(OPENVINO_REDUCE_MAX_LOWEST, [provider]), (provider, raw)
        np.testing.assert_array_equal(ort.InferenceSession(fixed, providers=[provider]).run(None, {"x": _MAXIMA})[0], want)


@pytest.mark.skipif(not _HAS_OPENVINO, reason="needs onnxruntime-openvino")
def test_safe_softmax_keeps_masked_rows_at_zero_on_openvino() -> None:
    """Attention's softmax over a row of only -inf gives 0 on OpenVINO's provider too."""
    x = torch.tensor([[float("-inf")] * 4, [1.0, 2.0, float("-inf"), 0.0]])
    fn = compile_ort(lambda t: torch.ops.aten._safe_softmax.default(t, 1), providers="openvino,cpu")
    assert_close(fn(x), torch.ops.aten._safe_softmax.default(x, 1))
    assert_ran_on_ort()

"""Known onnxruntime bugs that give wrong numbers (or run far slower than they should), and what
ort-lazy does about each.

Each wrong-number entry is checked by ``tests/test_ort_quirks.py`` twice: the bug itself (so the
suite notices when an onnxruntime release fixes or re-breaks it) and the model ort-lazy builds
(right). Slow entries are measured in ``benchmarks/`` (never in tests); the tests check that the
workaround applies where it should.

Entries say which onnxruntime versions (and providers) have the bug. Those keyed by version
(:data:`KNOWN_BUGS`, :func:`has_bug`) were bisected over onnxruntime 1.19-1.32 (CPU wheels, pure
ONNX models) and, for OpenVINO's provider, found on onnxruntime-openvino 1.24.1. The other
wrong-number entries hold on every CPU wheel from 1.19 to 1.32 (checked the same way); the speed
entries were measured on 1.32. :func:`kernel_fixes` rewrites a model around the version-keyed
kernel bugs of the installed onnxruntime and the providers that run it.

The version-keyed table is in :mod:`~ort_lazy.runtime.known_bugs`, :func:`kernel_fixes` in
:mod:`~ort_lazy.runtime.kernel_fixes`; both are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .kernel_fixes import KERNEL_FIXES_FACT, kernel_fixes
from .known_bugs import (
    AVERAGE_POOL_PADDED_DIVISOR,
    INT64_REDUCTIONS_IN_DOUBLE_SINCE,
    KNOWN_BUGS,
    NOT_WHERE_FUSION_SINCE,
    OPENVINO_REDUCE_MAX_LOWEST,
    POOL_CEIL_EXTRA_WINDOW,
    KnownBug,
    has_bug,
)
from .onnx_graphs import _graphs, _subgraphs, _types_and_shapes, _uses, _value_types

if TYPE_CHECKING:
    from ..specs import OrtModel

__all__ = [
    "disabled_optimizers",
    "has_vector_matmul",
    "model_vector_matmul",
    "EXACT_SIGMOID_FACT",
    "MATMUL_TRANSPOSE_FUSION",
    "TRANSPOSED_A_MATMUL",
    "MATMUL_TRANSPOSES_FACT",
    "SLOW_TRANSPOSED_A_MACS",
    "fuse_matmul_transposes",
    "SKIP_LAYER_NORM_FUSION",
    "INT64_REDUCTIONS_IN_DOUBLE",
    "WHERE_DROPS_NEGATIVE_ZERO",
    "NOT_WHERE_FUSION",
    "SIGMOID_APPROXIMATION",
    "DOUBLE_LOG_SOFTMAX_NAN",
    "exact_sigmoid",
    "missing_at_run_time",
    "KNOWN_BUGS",
    "KnownBug",
    "INT64_REDUCTIONS_IN_DOUBLE_SINCE",
    "NOT_WHERE_FUSION_SINCE",
    "POOL_CEIL_EXTRA_WINDOW",
    "AVERAGE_POOL_PADDED_DIVISOR",
    "OPENVINO_REDUCE_MAX_LOWEST",
    "KERNEL_FIXES_FACT",
    "has_bug",
    "kernel_fixes",
]

#: ORT's MatmulTransposeFusion folds a Transpose into a MatMul (FusedMatMul with transA/transB).
#: With a 1-D operand on the other side it computes the wrong product (onnxruntime 1.32:
#: ``MatMul(Transpose(A), v)`` returns garbage; the backward of mv, addmv, addr and
#: ``matmul(2-D, 1-D)`` has exactly this shape). Sessions of models holding a MatMul with a 1-D
#: (or unknown-rank) operand run without that one optimizer; every other model keeps it.
MATMUL_TRANSPOSE_FUSION = "MatmulTransposeFusion"


#: The same optimizer turns ``MatMul(Transpose(a), b)`` with a 2-D ``a`` (the weight gradient of
#: every linear layer, ``x^T @ dy``) into a FusedMatMul with transA, which the CPU provider runs
#: 15-40% slower than a MatMul after an explicit Transpose (onnxruntime 1.32, x86-64 AVX-512,
#: float32, in training backward graphs at two threads: ``[256, 1024]^T @ [256, 4096]`` 11.4 ms
#: against 7.9 + 0.1; ``[256, 256]^T @ [256, 1024]`` 0.73 against 0.57 + 0.03; ``[256, 256]^T @
#: [256, 256]`` 0.17 against 0.12 + 0.02). Its batched form (attention's gradients) and every
#: transB form are faster fused. Models for the CPU provider holding such a product get the
#: optimizer's other float32 fusions written in by :func:`fuse_matmul_transposes`, and their
#: sessions run without it: the feed-forward block's backward 33.5 -> 27.2 ms.
TRANSPOSED_A_MATMUL = "FusedMatMul"

#: The transposed products :data:`TRANSPOSED_A_MATMUL` leaves unfused: ``[k, m]^T @ [k, n]`` with
#: ``n >= k`` (FusedMatMul's cost grows with ``m * n``, the Transpose's with ``m * k``: ``[1024,
#: 2048]^T @ [1024, 256]`` 3.9 ms fused against 3.6 + 1.0 unfused) and at least this many
#: multiply-adds (a 256-wide MLP's at batch 32, 2M, run the same either way at one thread, 7%
#: slower unfused at two).
SLOW_TRANSPOSED_A_MACS = 8 * 2**20

#: :attr:`~ort_lazy.specs.OrtModel.facts` entry: whether the model's sessions on the CPU provider
#: run without MatmulTransposeFusion (:func:`fuse_matmul_transposes` done at export); absent when
#: the rewrite is left to session creation
MATMUL_TRANSPOSES_FACT = "matmul_transposes"


#: ORT's SkipLayerNormFusion turns ``LayerNormalization(Add(x, skip))`` (every residual block of
#: a post-norm transformer) into one SkipLayerNormalization, whose CPU kernel is several times
#: slower than the two ops it replaces on 3-D inputs (onnxruntime 1.32, x86-64 with AVX-512,
#: float32 [2, 128, 256]: 0.21 ms against 0.08 at 2 threads, 0.35 against 0.06 at one; [4, 1024,
#: 1024]: 11.4 against 3.2 ms). Same numbers either way (1e-6). Sessions on the CPU provider run
#: without that optimizer: BERT inference 6% faster (16% with int8 weights), a
#: TransformerEncoderLayer 9%, GPT-2 6%. Other providers keep it (a fused kernel on GPUs).
SKIP_LAYER_NORM_FUSION = "SkipLayerNormFusion"


#: ORT's CPU ReduceSum and ReduceProd compute int64 in double (onnxruntime 1.27 and later: ``2**53
#: + 1`` sums to ``2**53``, overflow saturates where PyTorch wraps; 1.19-1.26 are exact). ort-lazy
#: lowers integer sums to CumSum and integer products to a tree of Mul
#: (``lowering.reductions.integer_sum`` / ``integer_prod``), which are exact on every version.
INT64_REDUCTIONS_IN_DOUBLE = ("ReduceSum", "ReduceProd")


#: ORT's CPU Where returns +0.0 where it selects a -0.0 from its first branch (onnxruntime 1.32,
#: every float type; a -0.0 from the second branch survives). Equal as numbers, so no parity
#: check sees it, but it flips ``1 / x``, ``atan2`` and ``copysign``. ort-lazy's own lowerings
#: that must keep a sign (``lowering.signs.copysign``) multiply by +-1 instead of selecting;
#: a user's ``torch.where`` choosing -0.0 still gives +0.0 on ORT.
WHERE_DROPS_NEGATIVE_ZERO = "Where"


#: ORT's NotWhereFusion turns ``Where(Not(c), x, y)`` into ``Where(c, y, x)``: the value in the
#: second branch moves to the first, where :data:`WHERE_DROPS_NEGATIVE_ZERO` drops its sign.
#: (onnxruntime 1.25 and later; 1.19-1.24 keep the sign.)
#: Every ``torch.where(a != b, ..., x)`` exports as ``Not(Equal)``, so the lowerings that keep a
#: -0.0 by selecting it from the second branch (``expm1``, ``log1p``) gave +0.0 for -0.0, as did a
#: user's ``torch.where(a != b, y, x)`` with -0.0 in ``x``. Sessions of models holding both ops run
#: without that optimizer (it saves one elementwise Not).
NOT_WHERE_FUSION = "NotWhereFusion"


#: ORT's CPU LogSoftmax for double gives finite numbers on a row holding NaN (onnxruntime 1.32:
#: ``[1, NaN, 2, 3]`` gives ``[45.05, NaN, 46.05, 47.05]``) and ``-inf`` beside ``+inf``, where
#: eager's whole row is NaN; the float kernel gives NaN rows. ort-lazy lowers float64
#: ``log_softmax`` to eager's ``x - max - log(sum(exp(x - max)))``
#: (``lowering.activations.log_softmax_float64``).
DOUBLE_LOG_SOFTMAX_NAN = "LogSoftmax"


#: ORT's CPU Sigmoid is an approximation good to about 1e-7 in absolute terms only (onnxruntime
#: 1.32; float32 is MLAS's logistic, which clamps its argument to [-18, 18]): 0 below -18 where
#: eager gives 1.5e-8 down to 1e-45, twice eager's value at -17, 17% off at -15, 2e-4 at -10; the
#: double kernel 1e-3 off at -30 and 0 below -37, float16 10 steps off at -12. ``log(sigmoid(x))``
#: was -inf below -18 where eager gives x (a hand-written binary cross-entropy: NaN), and the
#: tails of ``silu``, ``glu`` and their gradients were as wrong. Models run by the CPU provider
#: get ``1 / (1 + exp(-x))`` in its place (:func:`exact_sigmoid`; half types in float32, rounded
#: once, as eager computes them): within 2 ulp down to the smallest normal number (0 where
#: ``exp(-x)`` overflows, below -88.7 in float32, where eager's results are subnormal), at four
#: elementwise passes for one.
SIGMOID_APPROXIMATION = "Sigmoid"


def exact_sigmoid(model_bytes: bytes, providers: Sequence[str] = ("CPUExecutionProvider",)) -> bytes:
    """``model_bytes`` with every Sigmoid written as ``1 / (1 + exp(-x))`` when ``providers``
    (in ORT's order of preference) start with the CPU provider; the same bytes otherwise, or when
    the model has none (see :data:`SIGMOID_APPROXIMATION`). Local functions holding one are
    inlined first."""
    if not providers or providers[0] != "CPUExecutionProvider" or SIGMOID_APPROXIMATION.encode() not in model_bytes:
        return model_bytes
    import onnx

    proto = onnx.load_from_string(model_bytes)
    if any(_is_sigmoid(n) for f in proto.functions for n in f.node):
        import onnx.inliner

        proto = onnx.inliner.inline_local_functions(proto)
    if not _exact_sigmoids(proto.graph, _value_types(proto), [0]):
        return model_bytes
    return proto.SerializeToString()


def _is_sigmoid(node: Any) -> bool:
    return node.op_type == SIGMOID_APPROXIMATION and node.domain in ("", "ai.onnx")


def fuse_matmul_transposes(
    model_bytes: bytes, providers: Sequence[str] = ("CPUExecutionProvider",)
) -> tuple[bytes, bool]:
    """``(model bytes, whether its sessions must run without MatmulTransposeFusion)`` for
    ``providers`` (in ORT's order of preference; see :data:`TRANSPOSED_A_MATMUL`). On the CPU
    provider a model holding a float32 ``MatMul(Transpose(a), b)`` of a 2-D ``a`` keeps that
    Transpose explicit, and every other float32 MatMul fed by a Transpose of its last two dims
    becomes the FusedMatMul the optimizer would have made (never with a 1-D operand: see
    :data:`MATMUL_TRANSPOSE_FUSION`). Any other model comes back unchanged, with False."""
    if (
        not providers
        or providers[0] != "CPUExecutionProvider"
        or b"Transpose" not in model_bytes
        or b"MatMul" not in model_bytes
    ):
        return model_bytes, False
    import onnx

    try:
        proto = onnx.load_from_string(model_bytes)
        graphs = _graphs(proto.graph)
        operands = {name for g in graphs for n in g.node if n.op_type == "MatMul" for name in n.input}
        # ort-lazy's exports record every value's type and shape: inference only for other models
        types, shapes = _types_and_shapes(proto, infer=False)
        if not operands <= types.keys() & shapes.keys():
            types, shapes = _types_and_shapes(proto)
        plans = [(graph, _transposed_products(graph, types, shapes)) for graph in graphs]
        if not any(slow for _, found in plans for _, slow in found):
            return model_bytes, False
        for graph, found in plans:
            if found:
                _fuse_transposes(graph, found)
        if not any(o.domain == "com.microsoft" for o in proto.opset_import):
            proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        return proto.SerializeToString(), True
    except Exception as e:  # a speed rewrite: a model it cannot read runs as it is, with ORT's fusion
        from .. import metrics

        metrics.warn_once(f"matmul_transposes:{type(e).__name__}", "ort-lazy: transposed products left to ORT: %s", e)
        return model_bytes, False


def _last_two_swapped(node: Any) -> int:
    """The rank of a Transpose ``node`` that swaps its last two dims and nothing else; else 0."""
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return 0
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    if not perm or len(perm) < 2 or perm != [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]:
        return 0
    return len(perm)


def _transposed_products(
    graph: Any, types: dict[str, int], shapes: dict[str, tuple[int | None, ...]]
) -> list[tuple[Any, bool]]:
    """``(MatMul node, slow)`` for each float32 MatMul of ``graph`` fed by a Transpose of
    its last two dims, both operands of rank 2 or more; ``slow``: its first operand is such a
    Transpose of a 2-D ``[k, m]`` tensor, the product's ``n`` is ``k`` or more and it has
    :data:`SLOW_TRANSPOSED_A_MACS` or more (see :data:`TRANSPOSED_A_MATMUL`)."""
    from onnx import TensorProto

    producers = {out: node for node in graph.node for out in node.output}
    found = []
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        if any(types.get(name) != TensorProto.FLOAT for name in node.input):
            continue
        swapped = [_last_two_swapped(producers.get(name)) for name in node.input]
        ranks = [r or len(shapes.get(name, ())) for r, name in zip(swapped, node.input)]
        if not any(swapped) or min(ranks) < 2:
            continue
        slow = False
        if swapped[0] == 2:
            a, b = shapes.get(producers[node.input[0]].input[0], ()), shapes.get(node.input[1], ())
            if len(a) == 2 and b:
                (k, m), n = a, b[-1]
                slow = None not in (k, m, n) and n >= k and k * m * n >= SLOW_TRANSPOSED_A_MACS
        found.append((node, slow))
    return found


def _fuse_transposes(graph: Any, found: list[tuple[Any, bool]]) -> None:
    """Write each of ``graph``'s planned MatMuls as a FusedMatMul reading its Transposes' inputs
    (a slow one's 2-D first operand stays transposed), and drop the Transposes nothing reads any
    more."""
    from onnx import helper

    producers = {out: node for node in graph.node for out in node.output}
    for node, slow in found:
        flags = {}
        inputs = list(node.input)
        for i, (name, flag) in enumerate(zip(node.input, ("transA", "transB"))):
            transpose = producers.get(name)
            if _last_two_swapped(transpose) and not (slow and i == 0):
                inputs[i] = transpose.input[0]
                flags[flag] = 1
        if flags:
            node.CopyFrom(
                helper.make_node(
                    "FusedMatMul", inputs, list(node.output), name=node.name, domain="com.microsoft", alpha=1.0, **flags
                )
            )
    uses = _uses(graph)
    kept = [n for n in graph.node if not (_last_two_swapped(n) and not uses.get(n.output[0]))]
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def _exact_sigmoids(graph: Any, types: dict[str, int], counter: list[int]) -> int:
    """Replace the Sigmoid nodes of ``graph`` and its subgraphs; the number replaced. A Sigmoid
    read only by ``Mul(x, Sigmoid(x))`` (silu) becomes ``x / (1 + exp(-x))`` with that Mul."""
    from onnx import TensorProto, helper

    uses = _uses(graph)
    silu: dict[str, Any] = {}  # Sigmoid output -> the Mul that makes it silu
    for node in graph.node:
        if node.op_type == "Mul" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
            a, b = node.input
            for y, x in ((a, b), (b, a)):
                if uses.get(y) == 1:
                    silu[y] = (x, node)
    replaced = 0
    nodes = []
    merged: set[int] = set()
    for node in graph.node:
        if id(node) in merged:
            continue
        for sub in _subgraphs(node):
            replaced += _exact_sigmoids(sub, types, counter)
        if not _is_sigmoid(node):
            nodes.append(node)
            continue
        counter[0] += 1
        stem = f"_exact_sigmoid{counter[0]}"
        x, y = node.input[0], node.output[0]
        numerator = None
        if y in silu and silu[y][0] == x:
            numerator, mul = silu[y]
            merged.add(id(mul))
            y = mul.output[0]
        dtype = types.get(x)
        # half types in float32 (ORT's CPU Neg has no float16 kernel); an unknown type in double
        work = dtype if dtype in (TensorProto.FLOAT, TensorProto.DOUBLE) else TensorProto.DOUBLE
        if dtype in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            work = TensorProto.FLOAT
        if work != dtype:
            nodes.append(helper.make_node("Cast", [x], [f"{stem}_x"], to=work))
            x = f"{stem}_x"
        one = helper.make_tensor("one", work, [], [1.0])
        last = (
            helper.make_node("Div", [x, f"{stem}_den"], [f"{stem}_y"])
            if numerator is not None
            else helper.make_node("Reciprocal", [f"{stem}_den"], [f"{stem}_y"])
        )
        nodes += [
            helper.make_node("Constant", [], [f"{stem}_one"], value=one),
            helper.make_node("Neg", [x], [f"{stem}_neg"]),
            helper.make_node("Exp", [f"{stem}_neg"], [f"{stem}_exp"]),
            helper.make_node("Add", [f"{stem}_exp", f"{stem}_one"], [f"{stem}_den"]),
            last,
        ]
        if dtype is None:
            nodes.append(helper.make_node("CastLike", [f"{stem}_y", node.input[0]], [y]))
        elif work != dtype:
            nodes.append(helper.make_node("Cast", [f"{stem}_y"], [y], to=dtype))
        else:
            last.output[0] = y
        replaced += 1
    if replaced:
        del graph.node[:]
        graph.node.extend(nodes)
    return replaced


def disabled_optimizers(
    model_bytes: bytes,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    vector_matmul: bool | None = None,
    transposed_a: bool = False,
) -> list[str]:
    """ORT graph optimizers to switch off for this model run by ``providers`` (in ORT's order
    of preference; see the module's entries). ``vector_matmul``: :func:`has_vector_matmul` of
    the model when already known (else it is worked out here); ``transposed_a``: what
    :func:`fuse_matmul_transposes` said of it."""
    disabled = []
    cpu = bool(providers) and providers[0] == "CPUExecutionProvider"
    if cpu and b"LayerNormalization" in model_bytes:
        disabled.append(SKIP_LAYER_NORM_FUSION)
    if b"Where" in model_bytes and b"Not" in model_bytes:
        disabled.append(NOT_WHERE_FUSION)
    if (transposed_a and cpu) or (has_vector_matmul(model_bytes) if vector_matmul is None else vector_matmul):
        disabled.append(MATMUL_TRANSPOSE_FUSION)
    return disabled


#: :attr:`~ort_lazy.specs.OrtModel.facts` entry of a model whose Sigmoids the export made exact
#: already (:func:`exact_sigmoid`), so opening a session need not parse it again
EXACT_SIGMOID_FACT = "exact_sigmoid"


def model_vector_matmul(model: OrtModel) -> bool:
    """:func:`has_vector_matmul` of ``model``, worked out once and kept on it (with it in the
    compile cache)."""
    return bool(model.fact("vector_matmul", has_vector_matmul))


def has_vector_matmul(model_bytes: bytes) -> bool:
    """Whether a MatMul of the model may see a 1-D operand (see :data:`MATMUL_TRANSPOSE_FUSION`)."""
    if b"MatMul" not in model_bytes:  # cheap pre-check: most models need no parsing
        return False
    import onnx

    return _has_vector_matmul(onnx.load_from_string(model_bytes))


def _ranks(graph: Any) -> dict[str, int]:
    ranks: dict[str, int] = {}
    for init in graph.initializer:
        ranks[init.name] = len(init.dims)
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        ttype = value.type.tensor_type
        if ttype.HasField("shape"):
            ranks[value.name] = len(ttype.shape.dim)
    return ranks


def _has_vector_matmul(proto: Any) -> bool:
    """Whether a MatMul may see a 1-D operand (unknown ranks and function bodies count)."""
    ranks = _ranks(proto.graph)
    operands = [name for n in proto.graph.node if n.op_type == "MatMul" for name in n.input[:2]]
    if any(name not in ranks for name in operands):
        import onnx

        try:
            ranks = _ranks(onnx.shape_inference.infer_shapes(proto).graph)
        except Exception:
            return True
    for node in proto.graph.node:
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
            if any(ranks.get(name, 1) == 1 for name in node.input[:2]):
                return True
    for function in proto.functions:
        if any(n.op_type == "MatMul" for n in function.node):
            return True
    return False


#: ORT's CPU ScatterElements / ScatterND registers float16 and bfloat16 kernels but refuses a
#: reduction other than "none" for them when it runs ("MLFloat16 data type is not supported with
#: ScatterElements opset 16 when reduction is 'add'"): scatter_add, scatter_reduce and index_add
#: in those dtypes are treated as having no kernel, so they stay in PyTorch up front.
_REDUCING_SCATTERS = {"ScatterElements", "ScatterND"}


def missing_at_run_time(node: Any, provider: str) -> bool:
    """Whether ORT's ``provider`` has a registered kernel for this ``onnx_ir`` node that still
    refuses it at run time (see the entries above)."""
    import onnx_ir as ir

    if provider != "CPUExecutionProvider" or node.op_type not in _REDUCING_SCATTERS:
        return False
    reduction = node.attributes.get("reduction")
    if reduction is None or reduction.value in ("none", b"none"):
        return False
    low = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    return any(v is not None and v.dtype in low for v in node.inputs)

"""Scaled dot-product attention as ONNX's ``Attention`` (opset 23): one ORT kernel.

In CPU inference graphs, ``F.scaled_dot_product_attention`` reaches the lowering as
``aten._scaled_dot_product_flash_attention_for_cpu``. Decomposed (two ``MatMul``, the scale, the
softmax with its guard for rows of only ``-inf``), ORT ran it as the projections' head-splitting
``Transpose`` nodes, a ``FusedMatMul``, the guarded ``Softmax``, a ``MatMul`` and the transpose
back: 4 ``Transpose`` of the activations per attention. ONNX's ``Attention`` (ORT's CPU kernel
since opset 23) takes the queries, keys and values in the projections' own layout
(``[batch, sequence, heads * head_size]``), so the translation turns each ``[batch, heads,
sequence, head_size]`` operand back into that layout, and ORT's transpose optimizer cancels that
with the graph's own head split: no ``Transpose`` left. One BERT layer (hidden 256, 4 heads,
batch 2 x 128, 2 cores): 0.53 ms against 0.65 ms decomposed, before the guard.

Its semantics are eager's: scale, additive float mask, ``is_causal`` aligned to the top left, and
rows whose mask is all ``-inf`` give 0 (the CPU kernel, as eager's fused kernel). ORT's kernel
does not broadcast the mask over the query length, so a mask of one row is expanded first.

The models ort-lazy translates are opset 18 (the exporter's library), where the default domain
has no ``Attention``. The translation emits it in :data:`PENDING_DOMAIN`; :func:`settle` then
converts the model to opset 23 (onnxscript's version converter) and moves those nodes into the
default domain. Where that cannot be done (a conversion fault, an op of the model without an
ORT kernel at opset 23), the caller translates the graph again with :func:`fused` off: the
decomposed form, with eager's rule for rows of only ``-inf``.

Applies to float32 attention without dropout and with queries, keys and values of the same
batch, heads and head size (no grouped heads); the rest is decomposed before export as before
(:func:`not_fusable` says why, for the lowering's decomposition and the support table).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .. import metrics
from .emitter import Emitter, translation_emitter

__all__ = ["PENDING_DOMAIN", "ATTENTION_OPSET", "FUSED_ON_CPU", "fused", "not_fusable", "settle", "TRANSLATIONS"]

_aten = torch.ops.aten

#: the domain the translation emits ``Attention`` in, until :func:`settle` moves it into the
#: default domain of the model converted to :data:`ATTENTION_OPSET`
PENDING_DOMAIN = "ort_lazy.pending"

#: the first opset whose default domain has ``Attention``
ATTENTION_OPSET = 23

#: whether CPU inference graphs keep attention whole for :func:`settle` to run as one
#: ``Attention`` (tests of the decomposed form turn it off)
FUSED_ON_CPU = True

#: whether this translation emits ``Attention`` (off: the decomposed form)
_FUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("ort_lazy_fused_attention", default=True)


@contextlib.contextmanager
def fused(on: bool) -> Iterator[None]:
    """Translate attention inside the block as one ``Attention`` (``on``) or decomposed."""
    token = _FUSED.set(on)
    try:
        yield
    finally:
        _FUSED.reset(token)


def not_fusable(
    query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False, attn_mask: Any = None
) -> str | None:
    """Why ``_scaled_dot_product_flash_attention_for_cpu`` on these (fake) tensors is not kept
    whole for ``Attention``; None when it is."""
    tensors = [query, key, value] + ([attn_mask] if attn_mask is not None else [])
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "operands that are not tensors"
    if any(t.dtype != torch.float32 for t in tensors):
        return "not float32"
    if any(t.device.type != "cpu" for t in tensors):
        return "not on the CPU"
    if dropout_p:
        return "dropout"
    if attn_mask is not None and is_causal:
        return "both a mask and is_causal"
    if any(t.dim() != 4 for t in (query, key, value)) or (attn_mask is not None and attn_mask.dim() > 4):
        return "operands that are not 4-d"
    dims = [_static(t) for t in (query, key, value)]
    heads, size = dims[0][1], dims[0][3]
    if heads is None or size is None:
        return "a symbolic head count or head size"
    if any(d[1] != heads or d[3] != size for d in dims[1:]):
        return "keys or values of other heads or head size"
    return None


def _static(value: Any) -> list[int | None]:
    """The dims of a tensor or an ``onnx_ir`` value, None where symbolic (four unknown dims
    for a value without a shape)."""
    return [d if isinstance(d, int) else None for d in value.shape] if value.shape is not None else [None] * 4


def _projection_layout(e: Emitter, x: Any, width: int) -> Any:
    """``[batch, heads, sequence, size]`` as ``[batch, sequence, heads * size]``."""
    import onnx_ir as ir

    moved = e.op("Transpose", x, perm=[0, 2, 1, 3])
    out = e.op("Reshape", moved, e.op("Constant", value_ints=[0, 0, width]))
    out.dtype = x.dtype
    dims = list(x.shape) if x.shape is not None else None
    if dims is not None:
        out.shape = ir.Shape([dims[0], dims[2], width])
    return out


def _length(e: Emitter, x: Any) -> Any:
    """The sequence length (axis 2) of ``[batch, heads, sequence, size]`` ``x``, shape [1]."""
    return e.op("Shape", x, start=2, end=3)


def _mask_rows(e: Emitter, mask: Any, query: Any) -> Any:
    """``mask`` with as many rows as ``query`` has positions (ORT's kernel does not broadcast
    the mask over them)."""
    dims = list(mask.shape) if mask.shape is not None else None
    length = list(query.shape)[2] if query.shape is not None else None
    if dims is not None and len(dims) >= 2 and isinstance(length, int) and dims[-2] == length:
        return mask
    shape = e.op("Concat", e.op("Constant", value_ints=[1, 1]), _length(e, query), e.op("Constant", value_ints=[1]), axis=0)
    out = e.op("Expand", mask, shape)
    out.dtype = mask.dtype
    return out


def _scores(e: Emitter, query: Any, key: Any, scale: float, is_causal: bool, attn_mask: Any) -> Any:
    """``query @ key^T * scale``, masked: the input of the softmax, ``[batch, heads, L, S]``."""
    import onnx_ir as ir

    t = query.dtype
    scores = e.op("Mul", e.op("MatMul", query, e.op("Transpose", key, perm=[0, 1, 3, 2])), e.const(scale, t))
    if attn_mask is not None:
        scores = e.op("Add", scores, attn_mask)
    if is_causal:
        lengths = e.op("Concat", _length(e, query), _length(e, key), axis=0)
        ones = e.op("ConstantOfShape", lengths, value=ir.tensor([1], dtype=ir.DataType.BOOL))
        allowed = e.op("Trilu", ones, upper=0)
        scores = e.op("Where", allowed, scores, e.const(-math.inf, t))
    scores.dtype = t
    if query.shape is not None and key.shape is not None:
        scores.shape = ir.Shape([*list(query.shape)[:3], list(key.shape)[2]])
    return scores


def flash_attention_for_cpu(
    query: Any,
    key: Any,
    value: Any,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    attn_mask: Any = None,
    scale: float | None = None,
) -> tuple[Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: the output as ONNX ``Attention``
    (in :data:`PENDING_DOMAIN`, see :func:`settle`) or decomposed, and the log-sum-exp of each
    query's scores (0 for a row of only ``-inf``, as eager's kernel)."""
    import onnx_ir as ir

    from .selects import safe_softmax

    if dropout_p:
        raise ValueError("attention with dropout is decomposed before export")
    e = translation_emitter("attention")
    dims = _static(query)
    heads, size = dims[1], dims[3]
    if heads is None or size is None:
        raise ValueError("attention needs static head counts and head sizes")
    t = query.dtype
    factor = float(scale) if scale is not None else 1.0 / math.sqrt(size)
    # the softmax's input: the decomposed form's, and the log-sum-exp's in either form
    scores = _scores(e, query, key, factor, is_causal, attn_mask)
    if _FUSED.get():
        inputs = [_projection_layout(e, x, heads * size) for x in (query, key, value)]
        if attn_mask is not None:
            inputs.append(_mask_rows(e, attn_mask, query))
        fused_out = e.op(
            "Attention", *inputs, domain=PENDING_DOMAIN,
            q_num_heads=heads, kv_num_heads=heads, scale=factor, is_causal=int(bool(is_causal)),
        )
        fused_out.dtype = t
        split = e.op("Reshape", fused_out, e.op("Constant", value_ints=[0, 0, heads, size]))
        out = e.op("Transpose", split, perm=[0, 2, 1, 3])
    else:
        out = e.op("MatMul", safe_softmax(scores, -1), value)
    out.dtype, out.shape = t, query.shape
    # the log-sum-exp output (read only by code calling this op itself: dead in graphs of
    # scaled_dot_product_attention, and removed with its nodes)
    lse = e.op("ReduceLogSumExp", scores, e.op("Constant", value_ints=[-1]), keepdims=0)
    lse = e.op("Where", e.op("Equal", lse, e.const(-math.inf, t)), e.const(0.0, t), lse)
    lse.dtype = t
    if query.shape is not None:
        lse.shape = ir.Shape(list(query.shape)[:3])
    return out, lse


def settle(model: Any, providers: Sequence[str] | None) -> bool:
    """Make the ``Attention`` nodes of :data:`PENDING_DOMAIN` in ``model`` (``onnx_ir``) ONNX's:
    the model converted to :data:`ATTENTION_OPSET`, those nodes in its default domain. Returns
    False, with the model left unusable, where that cannot be done or ORT has no kernel for an
    op of the converted model on ``providers`` (the caller translates again with
    ``fused(False)``); True (nothing done) for a model without such nodes."""
    pending = [node for node in model.graph.all_nodes() if node.domain == PENDING_DOMAIN]
    if not pending:
        return True
    from onnxscript.version_converter import convert_version

    from ..runtime.kernels import unsupported_nodes

    try:
        if model.opset_imports.get("", ATTENTION_OPSET) < ATTENTION_OPSET:
            convert_version(model, ATTENTION_OPSET)
        for node in pending:
            node.domain = ""
            node.version = ATTENTION_OPSET
        model.opset_imports.pop(PENDING_DOMAIN, None)
        model.opset_imports[""] = max(model.opset_imports.get("", 0), ATTENTION_OPSET)
        missing = unsupported_nodes(model, list(providers or ("CPUExecutionProvider",)))
    except Exception as e:
        metrics.warn_once(
            f"attention-opset:{type(e).__name__}",
            "ort-lazy: attention of %s stays decomposed (opset %d conversion failed: %s)",
            model.graph.name, ATTENTION_OPSET, f"{type(e).__name__}: {e}"[:200],
        )
        return False
    if missing:
        metrics.warn_once(
            f"attention-kernels:{missing[0]}",
            "ort-lazy: attention of %s stays decomposed (at opset %d, ORT has no kernel for %s)",
            model.graph.name, ATTENTION_OPSET, missing[0],
        )
        return False
    return True


TRANSLATIONS: dict[torch._ops.OpOverload, Any] = {
    _aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
}

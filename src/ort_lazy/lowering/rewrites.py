"""Rewrites into ops ORT runs well.

``nn.TransformerEncoderLayer`` in eval / no-grad takes a fused fast path
(``torch._transformer_encoder_layer_fwd``) that the exporter cannot translate. Dynamo records it
in the graph; before AOTAutograd lowers the graph, each such call is replaced by the same
computation written with ordinary functional ops, which then runs on ORT.

:data:`DECOMPOSITIONS` replaces ops whose ONNX translation is missing or slow in ORT by
equivalents made of cheap ops (concatenations and slices instead of scatters, patterns ORT
fuses): exact, except GELU, which ORT's fused kernel computes to within rounding.
:func:`drop_unused_indices` turns max pooling whose indices nobody reads into plain pooling.
"""

from __future__ import annotations

import copy
import itertools
import math
import operator
import struct
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .. import _compat
from ..support import float32_exact
from .distances import DISTANCE_DECOMPOSITIONS
from .guards import _once
from .indexing import INDEXING_DECOMPOSITIONS, in_layout_of
from .order import ORDER_DECOMPOSITIONS
from .padding import PADDING_DECOMPOSITIONS
from .scans import SCAN_DECOMPOSITIONS

__all__ = ["transformer_encoder_layer", "lower_fast_paths", "drop_unused_indices", "DECOMPOSITIONS"]


def transformer_encoder_layer(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    in_proj_weight: torch.Tensor,
    in_proj_bias: torch.Tensor,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm1_weight: torch.Tensor,
    norm1_bias: torch.Tensor,
    norm2_weight: torch.Tensor,
    norm2_bias: torch.Tensor,
    linear1_weight: torch.Tensor,
    linear1_bias: torch.Tensor,
    linear2_weight: torch.Tensor,
    linear2_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    """What ``torch._transformer_encoder_layer_fwd`` computes (batch-first input, no mask)."""
    batch, seq, _ = src.shape
    head_dim = embed_dim // num_heads

    def self_attention(x: torch.Tensor) -> torch.Tensor:
        q, k, v = F.linear(x, in_proj_weight, in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, seq, num_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v)
        attn = attn.transpose(1, 2).reshape(batch, seq, embed_dim)
        return F.linear(attn, out_proj_weight, out_proj_bias)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, linear1_weight, linear1_bias)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, linear2_weight, linear2_bias)

    shape = (embed_dim,)
    if norm_first:
        x = src + self_attention(F.layer_norm(src, shape, norm1_weight, norm1_bias, eps))
        return x + feed_forward(F.layer_norm(x, shape, norm2_weight, norm2_bias, eps))
    x = F.layer_norm(src + self_attention(src), shape, norm1_weight, norm1_bias, eps)
    return F.layer_norm(x + feed_forward(x), shape, norm2_weight, norm2_bias, eps)


def _arg(node: torch.fx.Node, index: int, name: str) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name)


def _calls(gm: torch.fx.GraphModule, target: Any) -> bool:
    """Whether ``gm`` or a graph it holds (a body, at any depth) calls ``target``."""
    if target is None:
        return False
    if any(node.op == "call_function" and node.target is target for node in gm.graph.nodes):
        return True
    return any(isinstance(c, torch.fx.GraphModule) and _calls(c, target) for c in gm.children())


def lower_fast_paths(gm: torch.fx.GraphModule) -> int:
    """Replace fast-path calls in a dynamo graph (in place), and in the graphs its higher-order
    ops call (a nested compile region's body: each is replaced by a changed copy); returns how
    many were replaced."""
    replaced = 0
    fast_path = _compat.transformer_encoder_fast_path()
    for name, child in list(gm.named_children()):
        if isinstance(child, torch.fx.GraphModule) and _calls(child, fast_path):
            body = torch.fx.GraphModule(child, copy.deepcopy(child.graph))
            replaced += lower_fast_paths(body)
            setattr(gm, name, body)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is not fast_path or fast_path is None:
            continue
        if _arg(node, 18, "mask") is not None:
            continue  # masked fast path: left as is (it runs in PyTorch)
        node.target = transformer_encoder_layer
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> Any:
    """``aten.convolution_backward`` as forward convolutions, which ORT runs (Conv/ConvTranspose).

    Covers non-transposed convolutions of any rank and group count; anything else returns
    ``NotImplemented`` and stays a single op. ``stride``, ``padding`` and ``dilation`` may hold
    one value for every spatial dim (a convolution with ``padding="valid"`` or ``"same"``, as
    Hugging Face's EfficientNet has, records ``[0]``).
    """
    if transposed:
        return NotImplemented
    spatial = input.dim() - 2
    stride, padding, dilation = (list(v) * spatial if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        # the input gradient is a transposed convolution of grad_output with the same weight;
        # output_padding recovers input sizes the strided forward rounded away
        extra = []
        for i in range(spatial):
            covered = (grad_output.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1) + 1
            extra.append(input.shape[2 + i] - covered)
        grad_input = torch.ops.aten.convolution.default(
            grad_output, weight, None, stride, padding, dilation, True, extra, groups
        )
    if output_mask[1]:
        grad_weight = _conv_weight_grad(grad_output, input, weight, stride, padding, dilation, groups)
    if output_mask[2]:
        grad_bias = grad_output.sum(dim=[0, *range(2, grad_output.dim())])
    return grad_input, grad_weight, grad_bias


def _concrete(*values: Any) -> bool:
    return all(isinstance(v, int) for v in values)


def _cat_into(base: torch.Tensor | None, like: torch.Tensor, sizes: Any, dim: int, start: Any, src: torch.Tensor) -> torch.Tensor:
    """``base`` (zeros of ``sizes`` when None) with ``src`` written at ``start`` along ``dim``.

    Built as one concatenation of [before, src, after]: ORT copies memory for it, where the
    exporter's scatter translations (ScatterElements with an index tensor) cost ~10x more. The
    result is contiguous, as the ``*_backward`` ops make theirs (from zeros); the scatters lay
    it out as their ``base`` (:func:`~.indexing.in_layout_of`).
    """
    size = sizes[dim]
    length = src.shape[dim]
    rest = size - start - length

    def piece(offset: Any, count: Any) -> torch.Tensor:
        if base is not None:
            return base.narrow(dim, offset, count)
        shape = list(sizes)
        shape[dim] = count
        return like.new_zeros(shape)

    pieces = []
    if not (_concrete(start) and start == 0):
        pieces.append(piece(0, start))
    pieces.append(src)
    if not (_concrete(rest) and rest == 0):
        pieces.append(piece(start + length, rest))
    if len(pieces) == 1:
        return src.clone(memory_format=torch.contiguous_format)
    return torch.cat(pieces, dim).contiguous()



def _slice_start(start: Any, size: Any) -> Any:
    """``start`` of ``x[start:]`` along a dim of ``size`` as aten normalizes it, or None if unknown."""
    if start is None:
        return 0
    if not _concrete(start, size):
        return None
    if start < 0:
        start += size
    return min(max(start, 0), size)


def select_scatter(base: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> Any:
    """``aten.select_scatter`` as a concatenation (exact), laid out as ``base`` as eager's is
    (a concatenation's own layout failed the trace of a later ``view`` that eager's allows:
    Hugging Face's Funnel Transformer ran wholly in PyTorch)."""
    dim %= base.dim()
    if not _concrete(index):
        return NotImplemented
    if index < 0:
        index += base.shape[dim]
    return in_layout_of(_cat_into(base, base, base.shape, dim, index, src.unsqueeze(dim)), base)


def _torch_decomposition(op: Any, *args: Any) -> Any:
    """PyTorch's own decomposition of ``op`` (for cases the rewrites here leave alone)."""
    return torch._decomp.decomposition_table[op](*args)


def select_backward(grad: torch.Tensor, input_sizes: list[int], dim: int, index: int) -> Any:
    """``aten.select_backward``: ``grad`` placed between zeros (exact)."""
    dim %= len(input_sizes)
    if not _concrete(index):
        return _torch_decomposition(torch.ops.aten.select_backward.default, grad, input_sizes, dim, index)
    if index < 0:
        index += input_sizes[dim]
    return _cat_into(None, grad, input_sizes, dim, index, grad.unsqueeze(dim))


def slice_scatter(base: torch.Tensor, src: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """``aten.slice_scatter`` with step 1 as a concatenation (exact), laid out as ``base`` (see
    :func:`select_scatter`); other steps unchanged."""
    dim %= base.dim()
    begin = _slice_start(start, base.shape[dim])
    if step != 1 or begin is None:
        return NotImplemented
    return in_layout_of(_cat_into(base, base, base.shape, dim, begin, src), base)


def slice_backward(grad: torch.Tensor, input_sizes: list[int], dim: int, start: Any, end: Any, step: int) -> Any:
    """``aten.slice_backward`` with step 1: ``grad`` placed between zeros (exact); other cases
    (strides, symbolic sizes) as PyTorch decomposes them."""
    dim %= len(input_sizes)
    begin = _slice_start(start, input_sizes[dim])
    if step != 1 or begin is None:
        return _torch_decomposition(torch.ops.aten.slice_backward.default, grad, input_sizes, dim, start, end, step)
    return _cat_into(None, grad, input_sizes, dim, begin, grad)


def split(x: torch.Tensor, split_size: int, dim: int = 0) -> Any:
    """``aten.split.Tensor`` (and ``unsafe_split``) as slices: the exporter's SplitToSequence +
    SequenceAt is slower."""
    dim %= x.dim()
    size = x.shape[dim]
    if not _concrete(split_size, size) or split_size <= 0:
        return NotImplemented
    return [x.narrow(dim, i, min(split_size, size - i)) for i in range(0, size, split_size)] or [x]


def split_with_sizes(x: torch.Tensor, split_sizes: list[int], dim: int = 0) -> Any:
    """``aten.split_with_sizes`` (and ``unsafe_split_with_sizes``) as slices: the exporter's
    SplitToSequence translation is ill-typed for ONNX type inference."""
    dim %= x.dim()
    if not _concrete(*split_sizes):
        return NotImplemented
    out, start = [], 0
    for size in split_sizes:
        out.append(x.narrow(dim, start, size))
        start += size
    return out


def _reduce_scalar(op: Any) -> Any:
    """A reduction of a 0-d tensor is the tensor itself (as bool for any/all): the exporter's
    translations of amax/amin/any/all are ill-typed for 0-d inputs."""

    def decompose(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if x.dim() != 0:
            return NotImplemented
        if op in (_aten.any, _aten.all):
            return x != 0 if x.dtype != torch.bool else x.clone()
        return x.clone()

    return decompose


def isnan_of_integers(x: torch.Tensor) -> Any:
    """``isnan`` of an integer or bool tensor: all False (ONNX's IsNaN takes floats only)."""
    if x.is_floating_point() or x.is_complex():
        return NotImplemented
    return torch.zeros_like(x, dtype=torch.bool)


def round_integers(x: torch.Tensor) -> Any:
    """``trunc``/``floor``/``ceil``/``round`` of integers: the values themselves (ONNX's Floor and
    friends take floats only)."""
    if x.is_floating_point() or x.is_complex():
        return NotImplemented
    return x.clone()


def batch_norm_no_training(x: torch.Tensor, *args: Any) -> Any:
    """Eval batch norm in float64 / float16 / bfloat16 as torch decomposes it (elementwise ops):
    the exporter's translation is ill-typed there; float32 keeps the single BatchNormalization."""
    if x.dtype == torch.float32:
        return NotImplemented
    return _torch_decomposition(_aten._native_batch_norm_legit_no_training.default, x, *args)


def layer_norm_low_precision(x: torch.Tensor, shape: list[int], weight: Any, bias: Any, eps: float) -> Any:
    """float16 / bfloat16 layer norm computed in float32 and rounded, as eager's CPU kernel does
    (its statistics come back in the input's dtype): the exporter's translation declares float16
    statistics ONNX's LayerNormalization does not make."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return NotImplemented

    def wide(t: Any) -> Any:
        return None if t is None else t.float()

    out, mean, rstd = _aten.native_layer_norm.default(x.float(), shape, wide(weight), wide(bias), eps)
    return out.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def _full_precision_only(op: Any) -> Any:
    """torch's decomposition of ``op`` for float32 / float64 only. For float16 / bfloat16 it
    computes the whole op in float32 and rounds once, where eager's CPU kernel rounds after each
    of its steps (``soft_margin_loss``: eager's ``exp(-y * x)`` is inf in float16 from
    ``y * x < -11``, the decomposition's stays finite): the op stays whole there."""

    def decompose(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args):
            return NotImplemented
        return torch._decomp.decomposition_table[op](*args, **kwargs)

    return decompose


def _reduced_dims(x: torch.Tensor, dim: Any) -> list[int]:
    """The dims a reduction's ``dim`` argument names, non-negative: every dim for None or an
    empty list, else ``dim`` (an int or a sequence) in its order."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    return [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]


def vector_norm(x: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """``linalg_vector_norm`` where the exporter's translation loses precision:

    * float16 / bfloat16: computed in float32 and rounded once, as eager's kernel accumulates
      (per-op float16 steps overflow: ``|x|**6`` of 8.5 is inf in float16);
    * float64 with an ord other than 0, 1, 2, +-inf: ``sum(|x|**ord) ** (1/ord)`` in aten ops,
      whose float exponents are kept exact (the translation's ``1/ord`` is a float32 constant:
      2e-7 relative error);
    * ord +-inf: ``amax`` / ``amin`` of ``|x|``, which propagate NaN as eager does (the
      translation's ReduceMax skips a NaN: the largest of the other elements where eager gives
      NaN).
    """
    if dtype is not None:
        return NotImplemented
    if x.dtype in (torch.float16, torch.bfloat16):
        return _aten.linalg_vector_norm.default(x.float(), ord, dim, keepdim).to(x.dtype)
    dims = _reduced_dims(x, dim)
    if x.is_floating_point() and ord in (math.inf, -math.inf):
        return x.abs().amax(dims, keepdim) if ord > 0 else x.abs().amin(dims, keepdim)
    if x.dtype == torch.float64 and isinstance(ord, (int, float)) and ord not in (0, 1, 2, math.inf, -math.inf):
        total = x.abs().pow(float(ord)).sum(dims, keepdim=keepdim)
        return total.pow(1.0 / float(ord))
    return NotImplemented


def nan_ignoring(op: Any) -> Any:
    """``fmax`` / ``fmin`` (``op``: ``maximum`` / ``minimum``) as a select around ``op``: a NaN in
    one operand gives the other, as eager does (ONNX has no NaN-ignoring Max/Min). Integers and
    bool hold no NaN: ``op`` itself."""

    def decompose(a: torch.Tensor, b: torch.Tensor) -> Any:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return NotImplemented
        both = op(a, b)
        if not both.is_floating_point():
            return both
        a, b = a.to(both.dtype), b.to(both.dtype)
        return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, both))

    return decompose


def hypot(a: torch.Tensor, b: torch.Tensor) -> Any:
    """``hypot`` without intermediate overflow or underflow, as eager's libm kernel computes it.

    float32 and narrower: ``sqrt(a*a + b*b)`` in float64 (no overflow or underflow for their
    range) rounded once. float64: scaled by ``m = max(|a|, |b|)``: ``m * sqrt((a/m)**2 + (b/m)**2)``,
    0 where both are 0, inf where either is infinite (even beside a NaN, as C's hypot).
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    if dtype != torch.float64:
        wa, wb = a.to(torch.float64).abs(), b.to(torch.float64).abs()
        out = torch.sqrt(wa * wa + wb * wb)
    else:
        wa, wb = a.to(dtype).abs(), b.to(dtype).abs()
        m = torch.maximum(wa, wb)
        safe = torch.where(m == 0, torch.ones_like(m), m)
        qa, qb = wa / safe, wb / safe
        out = m * torch.sqrt(qa * qa + qb * qb)
    out = torch.where((wa == math.inf) | (wb == math.inf), torch.full_like(out, math.inf), out)
    return out.to(dtype)


def mean_in_dtype(op: Any) -> Any:
    """``mean(x, ..., dtype=d)`` with ``x`` cast to ``d`` first, as eager computes it. The
    exporter averaged in ``x``'s own type and cast the result: an integer tensor's mean came
    out truncated (0.8 as 0.0), a float16 mean lost float32's digits."""

    def mean(x: torch.Tensor, *args: Any, dtype: Any = None) -> Any:
        if dtype is None or dtype == x.dtype:
            return NotImplemented
        return op(x.to(dtype), *args)

    return mean


def promoted_power(x: torch.Tensor, exponent: Any) -> Any:
    """``pow`` of tensors whose base has another dtype than the result (an integer base, a
    float16 exponent) with the base cast first: ONNX ``Pow`` gives its base's type, and ORT
    refused the session of the whole region."""
    dtype = torch.result_type(x, exponent)
    if x.dtype == dtype:
        return NotImplemented
    return torch.pow(x.to(dtype), exponent)


def integer_power(x: torch.Tensor, exponent: Any) -> Any:
    """``x ** k`` of an integer or bool tensor and a constant ``k >= 0`` as products (square and
    multiply): exact, and wrapping on overflow as PyTorch's kernel does (products modulo
    2**bits do not depend on their order). ORT's integer ``Pow`` goes through floating point
    (see :func:`ort_lazy.support._integer_power`)."""
    if x.dtype.is_floating_point or x.dtype.is_complex or not isinstance(exponent, int) or exponent < 0:
        return NotImplemented
    x = x.to(torch.result_type(x, exponent))  # bool ** k is an int64 power
    if exponent == 0:
        return torch.ones_like(x)
    result, base, k = None, x, int(exponent)
    while k:
        if k & 1:
            result = base if result is None else result * base
        k >>= 1
        if k:
            base = base * base
    assert result is not None
    return result.clone() if result is x else result


#: exponents eager's CPU ``pow`` computes without ``std::pow`` (float32, float64, bfloat16)
_POWERS: dict[float, Any] = {
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    0.5: torch.sqrt,
    -0.5: lambda x: 1.0 / torch.sqrt(x),
    -1.0: lambda x: 1.0 / x,
    -2.0: lambda x: 1.0 / (x * x),
}


def scalar_power(x: torch.Tensor, exponent: Any) -> Any:
    """``x ** k`` for a Python number ``k``: integer bases by :func:`integer_power`; float32,
    float64 and bfloat16 bases with ``k`` in (2, 3, 0.5, -0.5, -1, -2) as eager's kernel computes
    them (products, ``sqrt``, a division), where ORT's ``Pow`` went through ``std::pow``: 20-30x
    slower than the products (1.5 ms against 50 us for 262144 floats) and unlike eager at the
    edges (``(-inf) ** 0.5`` inf where eager gives NaN, ``(-0.0) ** 0.5`` +0.0)."""
    if not x.is_floating_point():
        return integer_power(x, exponent)
    if x.dtype not in (torch.float32, torch.float64, torch.bfloat16) or isinstance(exponent, bool):
        return NotImplemented
    if not isinstance(exponent, (int, float)) or float(exponent) not in _POWERS:
        return NotImplemented
    if x.dtype == torch.bfloat16 and exponent == -0.5:  # eager's rsqrt: in float32, rounded once
        return _POWERS[-0.5](x.float()).to(x.dtype)
    return _POWERS[float(exponent)](x)


def integer_division(a: torch.Tensor, b: Any, rounding_mode: str | None = None) -> Any:
    """``div`` of integers with ``rounding_mode`` "floor" / "trunc" in integer arithmetic: the
    exporter's translation divides in float32, wrong from 2**24 (``123456789 // 7`` off by 2).
    Floor is ``floor_divide``; trunc adds 1 back where the signs differ and a remainder is left."""
    if rounding_mode not in ("floor", "trunc") or not isinstance(a, torch.Tensor):
        return NotImplemented
    if not isinstance(b, torch.Tensor):
        if not isinstance(b, int) or isinstance(b, bool):
            return NotImplemented
        b = torch.scalar_tensor(b, dtype=a.dtype, device=a.device)
    if a.is_floating_point() or b.is_floating_point() or a.dtype == torch.bool or b.dtype == torch.bool:
        return NotImplemented
    q = torch.floor_divide(a, b)
    if rounding_mode == "floor":
        return q
    inexact = (q * b) != a
    return torch.where(inexact & ((a < 0) != (b < 0)), q + 1, q)


def infinity_test(kind: str) -> Any:
    """``isinf`` / ``isposinf`` / ``isneginf`` of float64 as comparisons: the exporter's
    translation casts to float32 first, so 1e300 reads as infinite."""

    def decompose(x: torch.Tensor) -> Any:
        if x.dtype != torch.float64:
            return NotImplemented
        if kind == "pos":
            return x == math.inf
        if kind == "neg":
            return x == -math.inf
        return x.abs() == math.inf

    return decompose


def _sign_bit(x: torch.Tensor) -> torch.Tensor:
    """The sign bit of a float tensor from comparisons: negative, or a zero whose reciprocal is
    negative (-0.0). ONNX before opset 26 has no bit cast, so a NaN reads as positive."""
    return (x < 0) | ((x == 0) & (torch.reciprocal(x) < 0))


def signbit(x: torch.Tensor) -> Any:
    """``signbit`` of floats true for -0.0 too (the translation, ``x < 0``, misses it)."""
    if not x.is_floating_point():
        return NotImplemented
    return _sign_bit(x)


def copysign(a: Any, b: Any) -> Any:
    """``copysign`` as ``|a|`` times +1 or -1 from the sign bit of ``b`` (-0.0 negative, as in eager).

    torch's reference decomposes to ``prims.signbit``, which has no ONNX mapping (and whose
    fake kernel says float where the real one says bool). A product, not a select: ORT's Where
    turns a -0.0 taken from its first branch into +0.0 (``runtime/quirks.py``).
    """
    if not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    magnitude = a.to(dtype).abs()
    if not isinstance(b, torch.Tensor):
        return -magnitude if math.copysign(1.0, float(b)) < 0 else magnitude
    return magnitude * (1 - 2 * _sign_bit(b.to(dtype)).to(dtype))


def atan2(y: Any, x: Any) -> Any:
    """``atan2`` with C's quadrants, zeros and infinities: ``atan(y / x)``, plus or minus pi
    where ``x``'s sign bit is set (-0.0 included), both infinities apart.

    The exporter's translation gave -pi for ``atan2(0.0, -5.0)`` (eager: pi, the phase of a
    negative real number), -pi/2 for ``atan2(1, -0.0)`` and 0 for ``atan2(inf, inf)``.
    float16 / bfloat16 compute in float32 (eager's kernels do); float64 has no ORT Atan kernel.
    """
    if not (isinstance(y, torch.Tensor) and isinstance(x, torch.Tensor)):
        return NotImplemented
    dtype = torch.result_type(y, x)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype == torch.float64:
        return NotImplemented
    y, x = y.to(torch.float32), x.to(torch.float32)
    neg_x, neg_y = _sign_bit(x), _sign_bit(y)
    y_sign = 1 - 2 * neg_y.to(torch.float32)  # +1 / -1 by y's sign bit
    half_turn = y_sign * math.pi
    # both zeros: atan(+-0 / 1) is +-0, then +-pi where x is -0.0, as C's atan2
    both_zero = (x == 0) & (y == 0)
    q = torch.atan(y / torch.where(both_zero, torch.ones_like(x), x))
    # Where keeps a -0.0 only from its second branch (quirks.WHERE_DROPS_NEGATIVE_ZERO): the
    # value that can be -0.0 (q) stays there
    r = torch.where(neg_x, q + half_turn, q)
    both_inf = torch.isinf(x) & torch.isinf(y)
    r = torch.where(both_inf, y_sign * torch.where(neg_x, 0.75 * math.pi, 0.25 * math.pi), r)
    return r.to(dtype)


def _nan_propagating(op: Any, kind: str) -> Any:
    """``amax``/``amin`` (``kind`` "values"), ``max.dim``/``min.dim`` ("both"), ``argmax``/
    ``argmin`` ("indices") of floats with eager's NaN rule: a NaN in the reduced elements is the
    result, its first position the index. ORT's ReduceMax/ArgMax skip NaN (a row [inf, NaN]
    gave inf where eager gives NaN). 0-d inputs go to :func:`_reduce_scalar`'s rule."""
    scalar = _reduce_scalar(op) if kind == "values" else None

    def decompose(x: torch.Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        if scalar is not None and x.dim() == 0:
            return scalar(x, dim, keepdim)
        if kind == "both" and x.dtype == torch.bool and dim is not None:
            # ORT has no bool ArgMax/ReduceMax: the same in int32
            values, indices = op(x.to(torch.int32), dim, keepdim)
            return values.to(torch.bool), indices
        if not x.is_floating_point() or x.dim() == 0:
            return NotImplemented
        if kind == "indices" and dim is None:
            if keepdim:
                return NotImplemented
            x, dim = x.reshape(-1), 0
        dims = [dim] if isinstance(dim, int) else list(dim) if dim not in (None, []) else list(range(x.dim()))
        nan = torch.isnan(x)
        any_nan = nan.any(dim=tuple(dims), keepdim=keepdim)
        # no dims spelt out as every dim: the translation of amax(x) with none fails to export
        out = op(x, dims if kind == "values" else dim, keepdim)
        if kind == "values":
            return torch.where(any_nan, torch.full_like(out, math.nan), out)
        first_nan = torch.argmax(nan.to(torch.uint8), dims[0], keepdim)
        if kind == "indices":
            return torch.where(any_nan, first_nan, out)
        values, indices = out
        return torch.where(any_nan, torch.full_like(values, math.nan), values), torch.where(any_nan, first_nan, indices)

    return _once(op, decompose)


def _whole(op: Any) -> Any:
    """``max()``/``min()`` of a whole tensor: ``amax``/``amin`` over every dim (NaN rule above)."""
    reduce = _nan_propagating(op, "values")

    def decompose(x: torch.Tensor) -> Any:
        if x.dtype == torch.bool:
            return op(x.to(torch.int32), list(range(x.dim()))).to(torch.bool)  # no bool ReduceMax in ORT
        if not x.is_floating_point():
            return NotImplemented
        return reduce(x, list(range(x.dim())), False)

    return decompose


def integer_relu(x: torch.Tensor) -> Any:
    """``relu`` of integers as a clamp (ORT's Relu has no int64 kernel)."""
    if x.is_floating_point() or x.dtype == torch.bool:
        return NotImplemented
    return torch.clamp_min(x, 0)


def clamp_scalars(x: torch.Tensor, min: Any = None, max: Any = None) -> Any:
    """``clamp`` of floats by one Python bound, the other given as infinity: the translation is
    ONNX ``Clip`` without it, which ORT takes as the dtype's largest finite value, so
    ``inf.clamp(min=0.5)`` gave 3.4e38 (and ``F.normalize`` of an infinite row a number where
    eager gives NaN)."""
    if not x.is_floating_point() or (min is None) == (max is None):
        return NotImplemented
    # both bounds Python floats: an int beside the float infinity matches no translation
    low = -math.inf if min is None else float(min) if isinstance(min, (int, float)) else min
    high = math.inf if max is None else float(max) if isinstance(max, (int, float)) else max
    return torch.clamp(x, low, high)


def one_sided_clamp(side: str) -> Any:
    """``clamp_min``/``clamp_max`` of floats as ``clamp`` with that one bound (the translation
    clips at the dtype's largest finite value, see :func:`clamp_scalars`)."""

    def decompose(x: torch.Tensor, bound: Any) -> Any:
        if not x.is_floating_point():
            return NotImplemented
        return torch.clamp(x, min=bound) if side == "min" else torch.clamp(x, max=bound)

    return decompose


def float_sign(x: torch.Tensor) -> Any:
    """``sign`` of floats as eager computes it, ``(x > 0) - (x < 0)``: 0 for NaN (ONNX's Sign
    gives NaN)."""
    if not x.is_floating_point():
        return NotImplemented
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


def real_sgn(x: torch.Tensor) -> Any:
    """``sgn``: :func:`float_sign` for floats, torch's own decomposition otherwise (this entry
    replaces it in the table, so declining would leave ``sgn`` untranslated)."""
    if x.is_floating_point():
        return float_sign(x)
    return _torch_decomposition(_aten.sgn.default, x)


def real_angle(x: torch.Tensor) -> Any:
    """``angle`` of real numbers: pi below 0, 0 otherwise, NaN for NaN (the translation gave 0)."""
    if x.is_complex():
        return NotImplemented
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    x = x.to(dtype)
    return torch.where(torch.isnan(x), x, torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x)))


def xlogy(x: Any, y: Any) -> Any:
    """``xlogy`` with eager's order of rules: NaN where ``y`` is NaN (even where ``x`` is 0), then
    0 where ``x`` is 0, else ``x * log(y)``."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return NotImplemented
    dtype = torch.result_type(x, y)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x, y = x.to(dtype), y.to(dtype)
    product = torch.where(x == 0, torch.zeros_like(x * y), x * torch.log(y))
    return torch.where(torch.isnan(y), y.expand_as(product), product)


def _left_number(number: Any, other: torch.Tensor) -> torch.Tensor:
    """A Python number on the left of a binary op as the 0-d tensor of the type eager computes
    the op in (``torch.result_type``: the number is a weak operand)."""
    return torch.scalar_tensor(number, dtype=torch.result_type(number, other), device=other.device)


def _number_on_the_left(op: Any, rewrite: Any = None) -> Any:
    """``op`` with a Python number as ``self`` (``1.0 - mask`` decomposes to ``sub.Tensor(1.0,
    mask)``, ``3 // x`` is ``floor_divide(3, x)``, ``2.5 % x`` is ``remainder.Scalar_Tensor``)
    called again with that number as :func:`_left_number`'s tensor, so the rewrites that expect
    a tensor there and the translation apply: the exporter has no overload for a number there
    (such ops ran in PyTorch), and ``remainder`` / ``floor_divide`` of a number missed eager's
    exact algorithms (``1e300 % x`` in float64 gave 0, ``1e300 // x`` in float16 inf for NaN).
    Other calls go to ``rewrite`` (or stay as they are)."""

    def decompose(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor) and isinstance(a, (bool, int, float)):
            return op(_left_number(a, b), b, *args, **kwargs)
        return NotImplemented if rewrite is None else rewrite(a, b, *args, **kwargs)

    return decompose


def float_floor_divide(a: Any, b: Any) -> Any:
    """Floating ``floor_divide`` / ``div(rounding_mode="floor")`` by eager's algorithm: the
    quotient of ``a - fmod(a, b)``, corrected by the remainder's sign and rounded to nearest.
    The translation's ``floor(a / b)`` gave inf for ``inf // 1`` (eager and Python: NaN) and
    rounds the quotient first. float16/bfloat16 compute in float32."""
    if not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    work = torch.float64 if dtype == torch.float64 else torch.float32
    a = a.to(work)
    b = b.to(work) if isinstance(b, torch.Tensor) else torch.full_like(a, float(b))
    mod = torch.fmod(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    quotient = a / b
    zero = torch.zeros_like(quotient) * torch.where(quotient < 0, -1.0, 1.0)  # copysign(0, a / b)
    out = torch.where(div == 0, zero, floor)
    return torch.where(b == 0, quotient, out).to(dtype)


def floor_division_mode(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    """``div`` with a rounding mode: integers by :func:`integer_division`, float "floor" by
    :func:`float_floor_divide`."""
    out = integer_division(a, b, rounding_mode)
    if out is NotImplemented and rounding_mode == "floor":
        return float_floor_divide(a, b)
    return out


_INTEGRAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)


def _reduced_last(x: torch.Tensor, dim: Any, keepdim: bool) -> tuple[torch.Tensor, list[int]] | None:
    """``x`` with the reduced dimensions moved last and flattened into one, and the result's
    shape; None when the sizes are symbolic."""
    if not all(isinstance(n, int) for n in x.shape):
        return None
    rank = x.dim()
    if rank == 0:
        return x.reshape(1), []
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        dims = list(range(rank))
    else:
        dims = sorted({d % max(rank, 1) for d in ([dim] if isinstance(dim, int) else dim)})
    kept = [d for d in range(rank) if d not in dims]
    shape = [1 if d in dims else x.shape[d] for d in range(rank)] if keepdim else [x.shape[d] for d in kept]
    flat = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1)
    return flat, shape


def integer_sum(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """int64 / int32 ``sum`` as the last element of a cumulative sum: ORT's ReduceSum accumulates int64 in
    double (onnxruntime 1.32: ``2**53 + 1`` sums to ``2**53``, overflow saturates where eager
    wraps); its CumSum is exact."""
    out = dtype or torch.int64
    if x.dtype not in _INTEGRAL or out not in (torch.int64, torch.int32):
        return NotImplemented
    moved = _reduced_last(x.to(out), dim, keepdim)
    if moved is None:
        return NotImplemented
    flat, shape = moved
    if flat.shape[-1] == 0:
        return torch.zeros(shape, dtype=out, device=x.device)
    return flat.cumsum(-1, dtype=out).select(-1, -1).reshape(shape)


def integer_prod(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """int64 / int32 ``prod`` as a tree of products of halves: ORT's ReduceProd multiplies int64 in double
    (wrong beyond 2**53). Products modulo 2**64 in any order equal eager's."""
    out = dtype or torch.int64
    if x.dtype not in _INTEGRAL or out not in (torch.int64, torch.int32):
        return NotImplemented
    moved = _reduced_last(x.to(out), dim, keepdim)
    if moved is None:
        return NotImplemented
    flat, shape = moved
    if flat.shape[-1] == 0:
        return torch.ones(shape, dtype=out, device=x.device)
    while flat.shape[-1] > 1:
        n = flat.shape[-1]
        if n % 2:
            flat = torch.cat([flat, torch.ones_like(flat[..., :1])], -1)
            n += 1
        flat = flat[..., : n // 2] * flat[..., n // 2 :]
    return flat.select(-1, 0).reshape(shape)


def _prod_dim(x: torch.Tensor, dim: int, keepdim: bool = False, *, dtype: Any = None) -> Any:
    return integer_prod(x, [dim], keepdim, dtype=dtype)


#: float types eager computes in float32 (its ``opmath``) and rounds once
_HALF = (torch.float16, torch.bfloat16)


def _accurate_log1p(x: torch.Tensor) -> torch.Tensor:
    u = 1 + x
    d = u - 1
    # log(u) * x / (u - 1) cancels the rounding of 1 + x (Goldberg); exact where 1 + x rounds to 1
    # x goes in Where's second branch: ORT's Where drops the sign of a -0.0 from its first
    body = torch.where(d != 0, torch.log(u) * (x / torch.where(d == 0, torch.ones_like(d), d)), x)
    return torch.where(x == math.inf, x, body)


def log1p(x: torch.Tensor) -> Any:
    """``log1p`` accurate for small ``x`` in float32 / float64: the exporter's ``Log(1 + x)`` is 0
    for ``|x|`` below the dtype's epsilon (``log1p(1e-10)`` gave 0 in float32). float16 /
    bfloat16 in float32, rounded once."""
    if x.dtype in _HALF:
        return _accurate_log1p(x.float()).to(x.dtype)
    if x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return _accurate_log1p(x)


def expm1(x: torch.Tensor) -> Any:
    """``expm1`` accurate for small ``x`` in float32 / float64 (the exporter's ``Exp(x) - 1``
    is 0 below the dtype's epsilon): ``(e**x - 1) * x / log(e**x)`` for ``|x| < 1`` (Kahan).
    float16 / bfloat16 in float32, rounded once, as eager's kernels compute them."""
    if x.dtype in _HALF:
        return expm1(x.float()).to(x.dtype)
    if x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    u = torch.exp(x)
    small = torch.abs(x) < 1
    logu = torch.where(small & (u != 1), torch.log(u), torch.ones_like(u))
    body = torch.where(small, (u - 1) * x / logu, u - 1)
    return torch.where(u != 1, body, x)  # x second: keeps -0.0 (quirks.WHERE_DROPS_NEGATIVE_ZERO)


def _log_add(exp: Any, ln_base: float) -> Any:
    """``logaddexp`` (``exp``, ln e = 1) and ``logaddexp2`` (``exp2``, ln 2) as
    ``max + log1p(exp(-|a - b|)) / ln base`` with :func:`log1p`'s accuracy (the exporter's form
    loses results below epsilon: ``logaddexp(-100, 0)`` and ``logaddexp2(0, -88)`` gave 0, and
    ``logaddexp2(0, 3e38)`` overflowed), equal infinities kept. float16 / bfloat16 in float32,
    rounded once as eager's kernels (``logaddexp(0, -5.66)`` was 12% off in float16, 0 in
    bfloat16)."""

    def decompose(a: torch.Tensor, b: torch.Tensor) -> Any:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return NotImplemented
        dtype = torch.result_type(a, b)
        if dtype in _HALF:
            return decompose(a.to(torch.float32), b.to(torch.float32)).to(dtype)
        if dtype not in (torch.float32, torch.float64):
            return NotImplemented
        a, b = a.to(dtype), b.to(dtype)
        m = torch.maximum(a, b)
        same_inf = torch.isinf(a) & (a == b)
        correction = _accurate_log1p(exp(-torch.abs(a - b)))
        if ln_base != 1.0:
            correction = correction / ln_base
        return torch.where(same_inf, a, m + correction)

    return decompose


logaddexp = _log_add(torch.exp, 1.0)
logaddexp2 = _log_add(torch.exp2, math.log(2.0))


def _float64_only(fn: Any) -> Any:
    """``fn`` for float64 inputs; other dtypes keep the exporter's translation (NotImplemented)."""

    def decompose(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float64:
            return NotImplemented
        return fn(x, *args, **kwargs)

    decompose.__doc__ = fn.__doc__
    return decompose


# float64 ops whose translation holds a Python float as a float32 constant (ONNX's value_float
# attribute and torchlib's scalar constants are float32): deg2rad was 8e-9 off relative, celu
# 1.4e-6, fmod(x, 1.1) 1.7e-6, sinc near its roots 2.8e-8 absolute. Written with the scalars
# as operands of aten arithmetic, which the exporter keeps in the tensor's dtype, and in eager's
# order of operations.


@_float64_only
def deg2rad(x: torch.Tensor) -> Any:
    """``x * (pi / 180)`` with a float64 constant."""
    return x * (math.pi / 180.0)


@_float64_only
def rad2deg(x: torch.Tensor) -> Any:
    """``x * (180 / pi)`` with a float64 constant."""
    return x * (180.0 / math.pi)


@_float64_only
def log2(x: torch.Tensor) -> Any:
    """``log(x) / log(2)`` with a float64 constant."""
    return torch.log(x) / math.log(2.0)


@_float64_only
def log10(x: torch.Tensor) -> Any:
    """``log(x) / log(10)`` with a float64 constant."""
    return torch.log(x) / math.log(10.0)


def sinc(x: torch.Tensor) -> Any:
    """``sin(pi x) / (pi x)``, 1 at 0: float64 with a float64 pi, float16 / bfloat16 in float32
    rounded once as eager's kernel (the translation's steps in float16 were 5000 steps off
    near the roots); float32 keeps the translation."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float64, *_HALF):
        return NotImplemented
    xf = x.float() if x.dtype in _HALF else x
    product = xf * math.pi
    return torch.where(xf != 0, torch.sin(product) / product, torch.ones_like(xf)).to(x.dtype)


@_float64_only
def hardtanh(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Any:
    """``clamp`` with float64 bounds."""
    return torch.clamp(x, min_val, max_val)


@_float64_only
def hardswish(x: torch.Tensor) -> Any:
    """``x * clamp(x + 3, 0, 6) / 6`` in float64."""
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


@_float64_only
def celu(x: torch.Tensor, alpha: float = 1.0) -> Any:
    """``alpha * expm1(x / alpha)`` below 0 (accurate expm1), ``x`` above."""
    return torch.where(x > 0, x, expm1(x * (1.0 / float(alpha))) * float(alpha))


def mish(x: torch.Tensor) -> Any:
    """float64 ``mish`` as eager computes it, ``x * tanh(log1p(exp(x)))`` (ORT's double Mish
    loses its tail: 1e-3 off at -30, 0 below -38 where eager gives 1e-15); float16 / bfloat16 in
    float32, rounded once, as eager (ORT's Mish has no kernel for them)."""
    if x.dtype in _HALF:
        return torch.nn.functional.mish(x.float()).to(x.dtype)
    if x.dtype != torch.float64:
        return NotImplemented
    return x * torch.tanh(torch.log1p(torch.exp(x)))


def softplus(x: torch.Tensor, beta: Any = 1, threshold: Any = 20) -> Any:
    """float64 ``softplus`` as eager computes it, ``x`` where ``beta * x > threshold``, else
    ``log1p(exp(beta * x)) / beta`` (ORT has no double Softplus kernel); float16 / bfloat16 in
    float32, rounded once, as eager."""
    if x.dtype in _HALF:
        return torch.nn.functional.softplus(x.float(), beta, threshold).to(x.dtype)
    if x.dtype != torch.float64:
        return NotImplemented
    scaled = x * beta
    return torch.where(scaled > threshold, x, torch.log1p(torch.exp(scaled)) / beta)


def _scaled_product(product_of: Any) -> Any:
    """``addmm``, ``addmv``, ``addbmm``, ``baddbmm``, ``addr`` (``beta * self + alpha *
    product``) of floats where the translation is wrong: ``beta=0`` ignores ``self`` in eager
    (NaN and inf in it are not propagated; the translation multiplied them by 0: NaN), and
    float64 ``alpha``/``beta`` that float32 cannot hold are products in float64 (the
    translation's Gemm holds them in float32 attributes: 1e-8 to 2e-7 off)."""

    def decompose(self: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
        if (
            not isinstance(self, torch.Tensor)
            or not self.is_floating_point()
            or not isinstance(beta, (int, float))
            or not isinstance(alpha, (int, float))
        ):
            return NotImplemented
        inexact = self.dtype == torch.float64 and not (float32_exact(float(beta)) and float32_exact(float(alpha)))
        if beta != 0 and not inexact:
            return NotImplemented
        product = product_of(a, b)
        if alpha != 1:
            product = product * alpha
        if beta == 0:
            return product
        return self * beta + product

    decompose.__doc__ = _scaled_product.__doc__
    return decompose


#: eager's ``hardsigmoid_backward`` scales by ``1.0f / 6.0f``, a float32 sixth, in float64 too
_FLOAT32_SIXTH = 0.1666666716337204


def hardsigmoid_backward(grad_output: torch.Tensor, self: torch.Tensor) -> Any:
    """float64 ``hardsigmoid`` gradients scaled by eager's float32 sixth (torch's reference
    decomposition, used for the other dtypes, scales by a float64 sixth: 7e-9 off eager's)."""
    if not isinstance(grad_output, torch.Tensor) or grad_output.dtype != torch.float64:
        return _torch_decomposition(_aten.hardsigmoid_backward.default, grad_output, self)
    inside = (self > -3.0) & (self < 3.0)
    return torch.where(inside, grad_output * _FLOAT32_SIXTH, torch.zeros_like(grad_output))


@_float64_only
def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> Any:
    """The rows ``indices`` names whose norm passes ``max_norm``, scaled by ``max_norm / (norm +
    1e-7)`` as eager's kernel does, with float64 constants (the translation's max_norm was
    float32: 1e-8 off)."""
    flat = indices.reshape(-1)
    rows = weight[flat]
    norms = torch.linalg.vector_norm(rows, norm_type, dim=-1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    return torch.index_put(weight, (flat,), rows * scale)


@_float64_only
def gelu_tanh(x: torch.Tensor, approximate: str = "none") -> Any:
    """The tanh form of ``gelu`` with float64 constants (the erf form is :func:`gelu`)."""
    if approximate != "tanh":
        return NotImplemented
    inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * 0.5 * (torch.tanh(inner) + 1.0)


def lerp_scalar(start: torch.Tensor, end: torch.Tensor, weight: float) -> Any:
    """``lerp`` with a Python weight, in eager's two-sided form with the side picked while
    tracing: the exporter's translation computes both sides for every element and selects with
    ``Where`` (a quarter of an Adam step's ORT time), and holds the weight as a float32 constant
    in float64. float32 and float64, which eager computes in their own precision; float16 and
    bfloat16 in float32, rounded once, as eager (step by step in float16, ``end - start``
    overflowed: inf where eager gives -45856)."""
    if not isinstance(end, torch.Tensor) or not isinstance(weight, (int, float)):
        return NotImplemented
    if end.dtype in _HALF and start.dtype == end.dtype:
        return lerp_scalar(start.float(), end.float(), weight).to(end.dtype)
    if end.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    diff = end - start
    return start + diff * float(weight) if abs(weight) < 0.5 else end - diff * (1.0 - float(weight))


def broadcast_copy(self: torch.Tensor, src: Any, non_blocking: bool = False) -> Any:
    """``aten.copy`` (what a functionalized ``copy_`` becomes): the source cast, expanded to
    ``self``'s shape and on its device. The exporter translates ``copy`` as a cast of the source
    alone, so ``y.copy_(row)`` then ``y.sum()`` summed one row."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if (
        isinstance(src, torch.Tensor)
        and src.device == self.device
        and src.dim() == self.dim()
        and all(statically_known_true(a == b) for a, b in zip(src.shape, self.shape))
    ):
        # same shape: a cast, or a copy ORT drops (its Cast to the same type copies)
        return src.clone() if src.dtype == self.dtype else NotImplemented
    if not isinstance(src, torch.Tensor):  # ``y.copy_(2.5)`` reaches here with the number
        return torch.full_like(self, src)
    return src.to(device=self.device, dtype=self.dtype).expand(self.shape).clone()


def fma(a: Any, b: Any, c: Any) -> Any:
    """``prims.fma`` (``a * b + c``, which an optimizer's step calls) as a product and a sum:
    ONNX has no fused multiply-add, so the sum rounds once more (within an ulp of eager's)."""
    return a * b + c


def float_arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> Any:
    """Floating ``arange`` as ``start + i * step`` over integer ``i``, in float64, rounded once
    (eager's CPU kernel). ORT's Range accumulates in the output type: ``arange(0, 1000, 0.1)``
    drifted by 0.097, nearly a whole step, in float32 and float64 alike."""
    if end is None:
        start, end = 0, start
    numbers = (start, end, step)
    if not all(type(v) in (int, float) for v in numbers):
        return NotImplemented  # symbolic bounds: the translation's Range
    if dtype is None:
        dtype = torch.get_default_dtype() if any(type(v) is float for v in numbers) else torch.int64
    if not dtype.is_floating_point or step == 0:
        return NotImplemented
    count = max(0, math.ceil((end - start) / step))
    index = torch.arange(count, dtype=torch.int64, device=device).to(torch.float64)
    return (index * float(step) + float(start)).to(dtype)


def _half_value(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to float16 / bfloat16 (to nearest, ties to even), in plain Python: a
    tensor made while tracing would enter the graph."""
    if dtype == torch.float16:
        try:
            return float(struct.unpack("<e", struct.pack("<e", value))[0])
        except (OverflowError, struct.error):  # past float16's range
            return math.copysign(math.inf, value)
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    if (bits >> 23) & 0xFF == 0xFF:  # inf / NaN
        return value
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _in_float32(op: Any, scalars: tuple[str, ...] = ()) -> Any:
    """``op`` of float16 / bfloat16 tensors (all of one dtype) computed in float32 and rounded
    once, as eager's kernels compute it (step by step in the half type, an intermediate rounds
    or overflows: ``addcmul``/``addcdiv``/``lerp`` gave inf where eager's results are finite, a
    scaled ``add`` cancelled 24 steps off); with ``scalars`` named, only where one of those
    keyword arguments is not 1 (a plain ``add`` is one rounding either way), and those rounded
    to the half type first, as eager's kernels take them (``add``'s ``alpha``)."""

    def decompose(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or tensors[0].dtype not in _HALF or any(t.dtype != tensors[0].dtype for t in tensors):
            return NotImplemented
        if scalars and all(kwargs.get(name, 1) == 1 for name in scalars):
            return NotImplemented
        for name in scalars:
            if isinstance(kwargs.get(name), (int, float)) and not isinstance(kwargs[name], bool):
                kwargs[name] = _half_value(float(kwargs[name]), tensors[0].dtype)
        wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        return op(*wide, **kwargs).to(tensors[0].dtype)

    return decompose


def _pointwise_with_value(divide: bool) -> Any:
    halves = _in_float32(_aten.addcdiv.default if divide else _aten.addcmul.default)

    def decompose(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, *, value: Any = 1) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in _HALF:
            return halves(x, t1, t2, value=value)
        if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in (x, t1, t2)):
            return NotImplemented
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return NotImplemented
        scaled = t1 * float(value)
        return x + (scaled / t2 if divide else scaled * t2)

    decompose.__doc__ = f"``addc{'div' if divide else 'mul'}`` of float64 with its ``value`` in float64."
    return decompose


def fmod_scalar(x: torch.Tensor, other: Any) -> Any:
    """``fmod`` of float64 by a Python number, the divisor as a float64 tensor."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float64 or not isinstance(other, (int, float)):
        return NotImplemented
    return torch.fmod(x, torch.full_like(x, float(other)))


def float_remainder(a: Any, b: Any) -> Any:
    """Floating ``remainder`` as eager computes it: ``fmod`` (exact), plus ``b`` where the signs
    differ. The translation's ``a - b * floor(a / b)`` rounds the quotient: ``remainder(3.3, 0.3)``
    gave 0.0 where eager gives 0.29999999999999993."""
    if not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    b = b.to(dtype) if isinstance(b, torch.Tensor) else torch.full_like(a, float(b), dtype=dtype)
    mod = torch.fmod(a.to(dtype), b)
    return torch.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def hardtanh_backward(grad: torch.Tensor, x: torch.Tensor, min_val: float, max_val: float) -> Any:
    """``hardtanh_backward`` as one select: the exporter's translation compares strictly, so it
    passed the gradient at ``min_val`` and ``max_val`` (``relu6`` at 0 and 6) where eager's is 0,
    and is ill-typed outside float32. NaN inputs follow eager's vectorized CPU kernels (its
    scalar tail keeps the gradient of a NaN either way): float16 and bfloat16 zero the gradient
    where ``x <= min or x >= max`` (a NaN keeps it), others keep it where ``min < x < max`` (a
    NaN loses it)."""
    zero = grad.new_zeros(())
    if grad.dtype in (torch.float16, torch.bfloat16):
        return torch.where((x <= min_val) | (x >= max_val), zero, grad)
    return torch.where((x > min_val) & (x < max_val), grad, zero)


def smooth_l1_loss_backward(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, reduction: int, beta: float) -> Any:
    """``smooth_l1_loss_backward`` as eager's kernel computes it: ``+-1`` where ``|d| >= beta``
    (``d = x - target``; its sign by ``d > 0``), ``d / beta`` elsewhere, times the norm and the
    gradient. torch's decomposition takes ``sign(d)`` where ``|d| < beta`` fails, so a NaN
    difference got ``sign(NaN) = 0``: a 0 gradient where eager's is NaN (a NaN prediction
    trained on silently instead of surfacing). float16 / bfloat16 in float32, rounded once, as
    eager computes them."""
    if x.dtype in _HALF:
        wide = smooth_l1_loss_backward(grad.float(), x.float(), target.float(), reduction, beta)
        return wide.to(x.dtype)
    d = x - target
    norm = 1.0 / x.numel() if reduction == 1 else 1.0  # Reduction.MEAN
    one = d.new_ones(())
    unit = torch.where(d > 0, one, -one)
    return norm * torch.where(d.abs() >= beta, unit, d / beta) * grad


def shifted_variance(x: torch.Tensor, dims: Any, correction: float, *, output_dtype: Any = None) -> Any:
    """``prims.var`` (every ``var``/``std``/``var_mean``) of floats as two passes over the data
    shifted by its first element along ``dims``: the translation subtracts the mean, which in
    float32 is only as exact as a float32 sum, so data far from 0 against its spread lost
    digits (``1e4 + 0.01 * randn``: 1e-3 relative, where eager accumulates in double), and a
    constant float64 column of 3e38 had variance 1.7e45 for 0. Shifted, the differences are
    exact where values are close (Sterbenz) and a constant column is 0 exactly. Static sizes
    only (the translation keeps the others); divides by ``max(0, N - correction)`` as eager."""
    if not x.is_floating_point() or output_dtype is not None or x.dim() == 0:
        return NotImplemented
    dims = _reduced_dims(x, dims)
    sizes = [_compat.static_int(x.shape[d]) for d in dims]
    if None in sizes:
        return NotImplemented
    count = math.prod(sizes)
    if count == 0:
        return NotImplemented
    pivot = x
    for d in dims:
        pivot = pivot.narrow(d, 0, 1)
    shifted = x - pivot
    deviation = shifted - shifted.mean(dims, keepdim=True)
    return (deviation * deviation).sum(dims) / max(0.0, count - correction)


def log_softmax_float64(x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
    """float64 ``_log_softmax`` as eager computes it, ``x - max - log(sum(exp(x - max)))``:
    ORT's double LogSoftmax kernel gives finite numbers on a row holding NaN (45.05 for 1) and
    ``-inf`` beside ``+inf``, where eager's whole row is NaN (its float kernel agrees with
    eager)."""
    if x.dtype != torch.float64 or half_to_float:
        return NotImplemented
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - torch.log(torch.exp(shifted).sum(dim, keepdim=True))


def safe_softmax_dtype(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> Any:
    """``aten._safe_softmax`` with a ``dtype``: the conversion, then the op itself, which ORT runs
    by ort-lazy's own translation (``export.selects.safe_softmax``: softmax with its guard for
    rows of only ``-inf`` run when such a row is there)."""
    if dtype is None or dtype == x.dtype:
        return NotImplemented
    return _aten._safe_softmax.default(x.to(dtype), dim)


def native_batch_norm(
    x: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool, momentum: float, eps: float
) -> Any:
    """``aten.native_batch_norm``: in eval, the no-training op (one BatchNormalization in ORT);
    in training, torch's decomposition (the training translation is distrusted)."""
    if not training and running_mean is not None and running_var is not None:
        return torch.ops.aten._native_batch_norm_legit_no_training.default(
            x, weight, bias, running_mean, running_var, momentum, eps
        )
    out, *stats = _torch_decomposition(
        torch.ops.aten.native_batch_norm.default, x, weight, bias, running_mean, running_var, training, momentum, eps
    )
    # eager's kernel writes its output contiguous (channels-last for a channels-last input), the
    # decomposition in the input's layout: a permuted input gave the traced graph other strides
    return (out.contiguous(memory_format=_compat.memory_format_of(x)), *stats)


def batch_norm_no_stats(x: torch.Tensor, *args: Any) -> Any:
    """``aten._native_batch_norm_legit.no_stats`` (batch norm without running statistics) in
    other dtypes than float32: torch's decomposition (in float32 for float16/bfloat16, as eager
    computes). The exporter's translation mixes float32 constants with the input's type there
    (ill-typed: the op stayed in PyTorch)."""
    if x.dtype == torch.float32:
        return NotImplemented
    return _torch_decomposition(_aten._native_batch_norm_legit.no_stats, x, *args)


def low_precision_random(op: Any) -> Any:
    """``rand`` / ``randn`` made in float16 or bfloat16: drawn in float32 and rounded, as ORT
    draws. The exporter's ``RandomUniformLike`` / ``RandomNormalLike`` are typed float32 for
    float16 (ORT refused the whole region's session) and have no bfloat16 form (left to
    PyTorch)."""

    def draw(size: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
        dtype = dtype or torch.get_default_dtype()
        if dtype not in (torch.float16, torch.bfloat16):
            return NotImplemented
        return op(size, dtype=torch.float32, **kwargs).to(dtype)

    return draw


def batch_norm_training(
    x: torch.Tensor,
    weight: Any,
    bias: Any,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    """``aten._native_batch_norm_legit_functional`` in training, float32, in 6 passes over the
    input where torch's decomposition takes 9: the batch statistics in two passes each (mean;
    mean of squared deviations, as torch's decomposition computes them), then ``deviation *
    scale + bias`` with the per-channel ``scale = weight * rstd`` (the deviation is the one the
    variance read; ``x * scale + (bias - mean * scale)`` would cost the same passes but cancel
    where the mean is large against the spread). ORT's own ``BatchNormalization`` with these
    statistics as inputs would be one pass, but its CPU kernel runs on one thread: slower than
    the two (ResNet-18's stem, 6.4M elements: 1.8 ms). Other dtypes and eval: torch's
    decomposition."""
    op = torch.ops.aten._native_batch_norm_legit_functional.default
    args = (x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training or x.dtype != torch.float32 or x.dim() < 2:
        return _torch_decomposition(op, *args)
    dims = [0, *range(2, x.dim())]
    mean = x.mean(dims, keepdim=True)
    deviation = x - mean
    var = (deviation * deviation).mean(dims, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    scale = rstd if weight is None else rstd * weight.reshape(mean.shape)
    output = deviation * scale
    if bias is not None:
        output = output + bias.reshape(mean.shape)
    save_mean, save_rstd, biased_var = mean.flatten(), rstd.flatten(), var.flatten()
    n = x.numel() / x.shape[1]
    new_running_mean = momentum * save_mean + (1 - momentum) * running_mean
    new_running_var = momentum * (biased_var * (n / (n - 1))) + (1 - momentum) * running_var
    return output, save_mean, save_rstd, new_running_mean, new_running_var


def layer_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: list[int],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Any,
    bias: Any,
    output_mask: list[bool],
) -> Any:
    """``aten.native_layer_norm_backward`` on the CPU (float32/float64) in 8 full-size writes where
    torch's decomposition takes 10 and three row sums: the two row sums of the input gradient
    that carry the weight, ``sum(g * w)`` and ``sum(g * xhat * w)``, are matrix-vector products
    with the weight (``g @ w``, ``(g * xhat) @ w``: one read each, ORT's GEMV about 3x faster
    than its ``Mul`` and ``ReduceSum``), and the input gradient is ``(g * w - xhat * (c / N) - b /
    N) * rstd`` (torch's: ``rstd / N * (N * g * w - b - xhat * c)``, one more pass). Weight and
    bias gradients are sums over the leading axes of ``g * xhat`` and ``g`` (matrix products on
    ORT's CPU provider, ``export.reductions``). Elsewhere (CUDA, whose matrix products may round
    through TF32; other dtypes; empty or symbolic normalized shapes): torch's decomposition."""
    op = torch.ops.aten.native_layer_norm_backward.default
    args = (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    dtype = input.dtype
    n = math.prod(normalized_shape) if all(_concrete(d) for d in normalized_shape) else None
    if (
        dtype not in (torch.float32, torch.float64)
        or input.device.type != "cpu"
        or any(t is not None and t.dtype != dtype for t in (grad_out, weight, bias, mean, rstd))
        or not n
        or input.numel() == 0
    ):
        return _torch_decomposition(op, *args)
    x = input.reshape(-1, n)
    g = grad_out.reshape(-1, n)
    mean, rstd = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    x_hat = (x - mean) * rstd
    d_input = d_weight = d_bias = None
    if weight is not None:
        w = weight.reshape(n, 1)
        g_x_hat = g * x_hat
        if output_mask[1]:
            d_weight = g_x_hat.sum(0).reshape(weight.shape)
        if output_mask[0]:
            b = torch.mm(g, w)
            c = torch.mm(g_x_hat, w)
            g_w = g * w.reshape(n)
    elif output_mask[0]:
        b = g.sum(1, keepdim=True)
        c = (g * x_hat).sum(1, keepdim=True)
        g_w = g
    if output_mask[0]:
        d_input = ((g_w - x_hat * (c / n) - b / n) * rstd).reshape(input.shape)
    if output_mask[2] and bias is not None:
        d_bias = g.sum(0).reshape(bias.shape)
    return d_input, d_weight, d_bias


def gelu(x: torch.Tensor, approximate: str = "none") -> Any:
    """``aten.gelu`` (erf form, float32/64) as ``x * (1 + erf(x / sqrt(2))) * 0.5``: the pattern
    ORT's optimizer fuses into its single-pass Gelu kernel (the exporter's whole-op translation
    multiplies in an order ORT does not recognise: five elementwise passes). float16 / bfloat16,
    both forms, in float32 rounded once."""
    if x.dtype in _HALF and approximate in ("none", "tanh"):
        # eager computes in float32 and rounds once; step by step in float16 / bfloat16, 1 + erf
        # cancels for negative x (gelu(-2.5) 2% off in float16, 6% in bfloat16)
        xf = x.float()
        if approximate == "tanh":
            # 0.5 * (1 + tanh(u)) as 1 / (1 + exp(-2u)): no cancellation where tanh(u) rounds
            # to -1 (nor ORT's Sigmoid, 3x off that far out)
            two_u = (xf + xf * xf * xf * 0.044715) * (2.0 * math.sqrt(2.0 / math.pi))
            return (xf / (torch.exp(-two_u) + 1.0)).to(x.dtype)
        return ((xf * (torch.erf(xf / math.sqrt(2.0)) + 1.0)) * 0.5).to(x.dtype)
    if approximate == "tanh":
        return gelu_tanh(x, approximate)
    if approximate != "none" or x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return (x * (torch.erf(x / math.sqrt(2.0)) + 1.0)) * 0.5


def _pool_geometry(spatial: int, kernel_size: Any, stride: Any, padding: Any) -> tuple[list[int], list[int], list[int]]:
    """Kernel, stride and padding of an average pooling, one entry per spatial dim."""

    def per_dim(v: Any, default: Any) -> list[int]:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        v = v or list(default)
        return v * spatial if len(v) == 1 else v

    kernel = per_dim(kernel_size, ())
    return kernel, per_dim(stride, kernel), per_dim(padding, (0,))


def _window_sizes(
    x: torch.Tensor, out_shape: Any, geometry: tuple[list[int], list[int], list[int]], include_pad: bool
) -> torch.Tensor:
    """Eager's divisor of every average-pooling window (broadcast over the spatial dims): its
    extent clipped to the padded input, or without ``include_pad`` to the input itself."""
    kernel, strides, pads = geometry
    spatial = len(kernel)
    factor = torch.ones((), dtype=x.dtype, device=x.device)
    for i in range(spatial):
        size, out = x.shape[x.dim() - spatial + i], out_shape[len(out_shape) - spatial + i]
        start = torch.arange(out, device=x.device) * strides[i] - pads[i]  # window o: [start, end)
        end = (start + kernel[i]).clamp_max(size + pads[i])
        if include_pad:
            counts = end - start
        else:
            counts = end.clamp_max(size) - start.clamp_min(0)
        shape = [1] * spatial
        shape[i] = out
        factor = factor * counts.to(x.dtype).reshape(shape)
    return factor


def _avg_pool_divided_by(op: Any, spatial: int) -> Any:
    """``avg_pool2d``/``avg_pool3d`` with ``divisor_override`` (which the translation ignores):
    the average with padding counted, times each window's size (eager's: clipped to the padded
    input, which ``ceil_mode`` windows can pass), divided by the divisor."""

    def decompose(
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> Any:
        if divisor_override is None or not x.is_floating_point():
            return NotImplemented
        geometry = _pool_geometry(spatial, kernel_size, stride, padding)
        average = op(x, *geometry, ceil_mode, True, None)
        return average * _window_sizes(x, average.shape, geometry, True) / divisor_override

    return decompose


def _avg_pool_backward(spatial: int) -> Any:
    """``avg_pool2d_backward``/``avg_pool3d_backward`` (no translation): each output gradient
    divided by its window's divisor, spread over its window by a transposed convolution with a
    kernel of ones (stride of the pooling, no padding), then cut to the input (the padding off).

    The kernel is cut to the padded input first (``min(kernel, padding + size)`` per dim): a
    window's part beyond it lands past the input, where the cut drops it. A pooling window far
    larger than its input (Hugging Face's EfficientNet pools globally with ``AvgPool2d(1280,
    ceil_mode=True)``) otherwise spread every gradient over the whole kernel: [2560, 1, 1280,
    1280] floats, 17 GB and 5 s per step, for a 2 x 1280 x 7 x 7 input."""
    transpose = F.conv_transpose2d if spatial == 2 else F.conv_transpose3d

    def decompose(
        grad: torch.Tensor,
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
    ) -> Any:
        if not grad.is_floating_point() or grad.dim() != spatial + 2:
            return NotImplemented
        kernel, strides, pads = geometry = _pool_geometry(spatial, kernel_size, stride, padding)
        if divisor_override is not None:
            scaled = grad / divisor_override
        else:
            scaled = grad / _window_sizes(x, grad.shape, geometry, count_include_pad)
        lead, out = scaled.shape[:2], scaled.shape[2:]
        reach = [min(k, p + size) for k, p, size in zip(kernel, pads, x.shape[2:])]
        ones = torch.ones([1, 1, *reach], dtype=grad.dtype, device=grad.device)
        spread = transpose(scaled.reshape(-1, 1, *out), ones, stride=strides)
        for i in range(spatial):
            size, dim = x.shape[2 + i], 2 + i
            short = pads[i] + size - spread.shape[dim]
            if short > 0:
                spread = F.pad(spread, [0, 0] * (spatial - 1 - i) + [0, short])
            spread = spread.narrow(dim, pads[i], size)
        return spread.reshape(*lead, *x.shape[2:])

    return decompose


def adaptive_avg_pool2d_backward(grad: torch.Tensor, x: torch.Tensor) -> Any:
    """``aten._adaptive_avg_pool2d_backward``. When the input divides into equal windows, each
    input element gets its window's gradient divided by the window height, then width (the
    order PyTorch's kernel divides in, so results are bit-identical). Otherwise the windows
    differ in size and may overlap (VGG's pooling to 7 x 7 from 8 x 8 or 1 x 1): the gradient is
    divided by each window's size and spread over its rows and columns by two products with
    0/1 window matrices (sums in another order than the kernel's: equal within rounding)."""
    *lead, h, w = x.shape
    oh, ow = grad.shape[-2:]
    if not _concrete(h, w, oh, ow, *lead) or oh == 0 or ow == 0 or not grad.is_floating_point():
        return NotImplemented
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        g = grad / kh / kw
        return g.reshape(*lead, oh, 1, ow, 1).expand(*lead, oh, kh, ow, kw).reshape(*lead, h, w)
    rows, heights = _pool_windows(h, oh, grad)
    cols, widths = _pool_windows(w, ow, grad)
    g = grad / heights.unsqueeze(-1) / widths
    return rows @ g @ cols.t()


def _pool_windows(size: int, out: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive pooling's windows along one axis: a [size, out] matrix, 1 where input element
    ``j`` lies in window ``i`` (``floor(i * size / out) <= j < ceil((i + 1) * size / out)``), and
    each window's length."""
    i = torch.arange(out, device=like.device)
    start = torch.div(i * size, out, rounding_mode="floor")
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode="floor")
    j = torch.arange(size, device=like.device).unsqueeze(-1)
    inside = (j >= start) & (j < end)
    return inside.to(like.dtype), (end - start).to(like.dtype)


def weight_norm_interface_backward(
    grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor, saved_norms: torch.Tensor, dim: int
) -> Any:
    """``aten._weight_norm_interface_backward`` (the gradient of ``weight_norm``'s
    ``w = g * v / |v|``, norms over every dim but ``dim``), as PyTorch's differentiable form
    computes it: ``grad_g = sum(grad_w * v) / |v|`` and
    ``grad_v = g / |v| * (grad_w - v * grad_g / |v|)``. wav2vec2's positional convolution."""
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    grad_g = (grad_w * saved_v).sum(dims, keepdim=True) / saved_norms
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g


_aten = torch.ops.aten

#: pooling ops with an indices output, and their index-free form
_POOL_WITHOUT_INDICES = {
    _aten.max_pool2d_with_indices.default: _aten.max_pool2d.default,
    _aten.max_pool3d_with_indices.default: _aten.max_pool3d.default,
}


def drop_unused_indices(gm: torch.fx.GraphModule) -> int:
    """Max pooling with indices becomes plain max pooling where the indices are unused
    (inference): the exporter computes torch-style indices with a second pooling and index
    arithmetic otherwise. In place; returns how many were replaced."""
    replaced = 0
    for node in list(gm.graph.nodes):
        plain = _POOL_WITHOUT_INDICES.get(node.target) if node.op == "call_function" else None
        if plain is None:
            continue
        users = list(node.users)
        if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
            continue
        if any(u.args[1] != 0 and u.users for u in users):
            continue  # the indices are used (training: the backward reads them)
        val = node.meta.get("val")
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(plain, node.args, node.kwargs)
        new.meta = dict(node.meta)
        if isinstance(val, (tuple, list)):
            new.meta["val"] = val[0]
        for u in users:
            u.replace_all_uses_with(new)
            gm.graph.erase_node(u)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


#: largest kernel (number of taps) whose weight gradient is computed as one matrix product
#: over unfolded input; the copies grow with it
_UNFOLD_MAX_TAPS = 49


def _conv_weight_grad(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> torch.Tensor:
    """The weight gradient of a (non-transposed) convolution.

    Small kernels: the input is unfolded (one strided slice per kernel tap) and the gradient is
    a matrix product per sample and group, summed over the batch; ORT runs this several times
    faster than a convolution whose "kernel" is the whole grad_output. Larger kernels: the
    input correlated with grad_output as a convolution.
    """
    spatial = input.dim() - 2
    n = input.shape[0]
    c_in = input.shape[1] // groups
    c_out = grad_output.shape[1] // groups
    kernel = list(weight.shape[2:])
    out_sizes = list(grad_output.shape[2:])
    taps = math.prod(kernel)
    if taps <= _UNFOLD_MAX_TAPS and _concrete(n, *out_sizes, *input.shape[2:]):
        x = input
        if any(padding):
            pads: list[int] = []
            for p in reversed(padding):
                pads += [p, p]
            x = torch.ops.aten.constant_pad_nd.default(x, pads, 0.0)
        cols = []
        for offsets in itertools.product(*(range(k) for k in kernel)):
            piece = x
            for i, k_i in enumerate(offsets):
                start = k_i * dilation[i]
                piece = torch.ops.aten.slice.Tensor(piece, 2 + i, start, start + stride[i] * (out_sizes[i] - 1) + 1, stride[i])
            cols.append(piece)
        positions = math.prod(out_sizes)
        # per sample and group: [Co, P] x [P, Ci*taps], then summed over the batch; the bmm of
        # a transposed view lets ORT fold the transpose into its GEMM (no copy)
        unfolded = torch.stack(cols, 2).reshape(n * groups, c_in * taps, positions)
        g = grad_output.reshape(n * groups, c_out, positions)
        gw = torch.bmm(g, unfolded.transpose(1, 2)).reshape(n, groups * c_out, c_in * taps)
        return gw.sum(0).reshape(groups * c_out, c_in, *kernel)
    # correlate input with grad_output over the batch: swap batch and channel axes, per group
    x = input.reshape(n, groups, c_in, *input.shape[2:]).transpose(0, 2)
    x = x.reshape(c_in, groups * n, *input.shape[2:])
    sp = list(range(3, 3 + spatial))
    g = grad_output.reshape(n, groups, c_out, *grad_output.shape[2:]).permute(1, 2, 0, *sp)
    g = g.reshape(groups * c_out, n, *grad_output.shape[2:])
    gw = torch.ops.aten.convolution.default(x, g, None, dilation, padding, stride, False, [0] * spatial, groups)
    gw = gw.reshape(c_in, groups * c_out, *gw.shape[2:]).transpose(0, 1)
    for i in range(spatial):
        gw = gw.narrow(2 + i, 0, weight.shape[2 + i])
    return gw.contiguous()


#: Extra decompositions added to the exporter's table (op -> implementation in ORT-friendly ops).
DECOMPOSITIONS = {
    _aten.convolution_backward.default: convolution_backward,
    _aten.select_scatter.default: select_scatter,
    _aten.select_backward.default: select_backward,
    _aten.slice_scatter.default: slice_scatter,
    _aten.slice_backward.default: slice_backward,
    _aten.split.Tensor: split,
    _aten.unsafe_split.Tensor: split,
    _aten.split_with_sizes.default: split_with_sizes,
    _aten.unsafe_split_with_sizes.default: split_with_sizes,
    **{op.default: _nan_propagating(op, "values") for op in (_aten.amax, _aten.amin)},
    **{op.dim: _nan_propagating(op, "both") for op in (_aten.max, _aten.min)},
    _aten.max.default: _whole(_aten.amax),
    _aten.min.default: _whole(_aten.amin),
    **{op.default: _nan_propagating(op, "indices") for op in (_aten.argmax, _aten.argmin)},
    **{getattr(op, o): _reduce_scalar(op) for op in (_aten.any, _aten.all) for o in ("default", "dim", "dims")},
    _aten.isnan.default: isnan_of_integers,
    **{op.default: round_integers for op in (_aten.trunc, _aten.floor, _aten.ceil, _aten.round)},
    _aten._native_batch_norm_legit_no_training.default: batch_norm_no_training,
    _aten.native_layer_norm.default: layer_norm_low_precision,
    _aten.hardtanh_backward.default: hardtanh_backward,
    _aten.smooth_l1_loss_backward.default: smooth_l1_loss_backward,
    _aten.linalg_vector_norm.default: vector_norm,
    **{op: _full_precision_only(op) for op in (_aten.soft_margin_loss.default, _aten.soft_margin_loss_backward.default)},
    _aten._safe_softmax.default: safe_softmax_dtype,
    _aten._log_softmax.default: log_softmax_float64,
    torch.ops.prims.var.default: shifted_variance,
    _aten.native_batch_norm.default: native_batch_norm,
    _aten._native_batch_norm_legit_functional.default: batch_norm_training,
    _aten._native_batch_norm_legit.no_stats: batch_norm_no_stats,
    _aten.rand.default: low_precision_random(_aten.rand.default),
    _aten.randn.default: low_precision_random(_aten.randn.default),
    _aten.native_layer_norm_backward.default: layer_norm_backward,
    _aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool2d_backward,
    _aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    _aten.gelu.default: gelu,
    _aten.fmax.default: nan_ignoring(torch.maximum),
    _aten.fmin.default: nan_ignoring(torch.minimum),
    _aten.hypot.default: hypot,
    _aten.pow.Tensor_Scalar: scalar_power,
    _aten.mean.default: mean_in_dtype(_aten.mean.default),
    _aten.mean.dim: mean_in_dtype(_aten.mean.dim),
    _aten.pow.Tensor_Tensor: promoted_power,
    _aten.div.Tensor_mode: floor_division_mode,
    _aten.div.Scalar_mode: floor_division_mode,
    _aten.floor_divide.default: _number_on_the_left(_aten.floor_divide.default, float_floor_divide),
    _aten.floor_divide.Scalar: float_floor_divide,
    _aten.sign.default: float_sign,
    _aten.clamp.default: clamp_scalars,
    **{getattr(_aten.clamp_min, o): one_sided_clamp("min") for o in ("default", "Tensor")},
    **{getattr(_aten.clamp_max, o): one_sided_clamp("max") for o in ("default", "Tensor")},
    _aten.sgn.default: real_sgn,
    _aten.angle.default: real_angle,
    _aten.xlogy.Tensor: xlogy,
    _aten.logaddexp2.default: logaddexp2,
    _aten.isinf.default: infinity_test("any"),
    _aten.isposinf.default: infinity_test("pos"),
    _aten.isneginf.default: infinity_test("neg"),
    _aten.sum.default: integer_sum,
    _aten.sum.dim_IntList: integer_sum,
    _aten.prod.default: integer_prod,
    _aten.prod.dim_int: _prod_dim,
    _aten.log1p.default: log1p,
    _aten.expm1.default: expm1,
    _aten.logaddexp.default: logaddexp,
    _aten.arange.default: float_arange,
    _aten.arange.start: float_arange,
    _aten.arange.start_step: float_arange,
    _aten.deg2rad.default: deg2rad,
    _aten.rad2deg.default: rad2deg,
    _aten.log2.default: log2,
    _aten.log10.default: log10,
    _aten.sinc.default: sinc,
    _aten.hardtanh.default: hardtanh,
    _aten.hardswish.default: hardswish,
    _aten.celu.default: celu,
    _aten.mish.default: mish,
    _aten.softplus.default: softplus,
    _aten.lerp.Scalar: lerp_scalar,
    _aten.lerp.Tensor: _in_float32(_aten.lerp.Tensor),
    _aten.add.Tensor: _in_float32(_aten.add.Tensor, ("alpha",)),
    _aten.sub.Tensor: _number_on_the_left(_aten.sub.Tensor, _in_float32(_aten.sub.Tensor, ("alpha",))),
    _aten.embedding_renorm.default: embedding_renorm,
    _aten.hardsigmoid_backward.default: hardsigmoid_backward,
    _aten.addmm.default: _scaled_product(torch.mm),
    _aten.addmv.default: _scaled_product(torch.mv),
    _aten.addbmm.default: _scaled_product(lambda a, b: torch.bmm(a, b).sum(0)),
    _aten.baddbmm.default: _scaled_product(torch.bmm),
    _aten.addr.default: _scaled_product(torch.outer),
    _aten.copy.default: broadcast_copy,
    _aten.addcmul.default: _pointwise_with_value(divide=False),
    _aten.addcdiv.default: _pointwise_with_value(divide=True),
    _aten.fmod.Scalar: fmod_scalar,
    _aten.remainder.Scalar: float_remainder,
    _aten.remainder.Tensor: float_remainder,
    _aten.remainder.Scalar_Tensor: _number_on_the_left(_aten.remainder.Tensor),
    _aten.bitwise_left_shift.Scalar_Tensor: _number_on_the_left(_aten.bitwise_left_shift.Tensor),
    _aten.bitwise_right_shift.Scalar_Tensor: _number_on_the_left(_aten.bitwise_right_shift.Tensor),
    _aten.atan2.default: atan2,
    _aten.signbit.default: signbit,
    _aten.copysign.Tensor: copysign,
    _aten.copysign.Scalar: copysign,
    _aten.relu.default: integer_relu,
    _aten.avg_pool2d.default: _avg_pool_divided_by(_aten.avg_pool2d.default, 2),
    _aten.avg_pool3d.default: _avg_pool_divided_by(_aten.avg_pool3d.default, 3),
    _aten.avg_pool2d_backward.default: _avg_pool_backward(2),
    _aten.avg_pool3d_backward.default: _avg_pool_backward(3),
    **SCAN_DECOMPOSITIONS,
    **INDEXING_DECOMPOSITIONS,
    **DISTANCE_DECOMPOSITIONS,
    **ORDER_DECOMPOSITIONS,
    **PADDING_DECOMPOSITIONS,
}

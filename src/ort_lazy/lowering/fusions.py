"""Activation functions written out in elementwise ops, recognised and made one aten op.

Models often spell the tanh approximation of GELU out in Python instead of calling
``F.gelu(x, approximate="tanh")``: GPT-2's ``NewGELUActivation``
(``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))))``), ``FastGELUActivation`` and
BLOOM's ``x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))``. Traced to aten, each
is about ten elementwise ops (``x**3`` is two products: :func:`~ort_lazy.lowering.arithmetic.scalar_power`),
so ORT runs ten passes over the tensor and its own fusion (which looks for ``Pow``) does not
apply. :func:`fuse_tanh_gelu` finds them by value, not by spelling: the ops between ``x`` and
``tanh`` must compute ``c * (x + k * x**3)`` and the ops after it ``0.5 * x * (1 + tanh(..))``,
as polynomials of ``x`` (and of the tanh) whatever the order of the products and sums; then the
whole expression becomes ``aten.gelu(x, approximate="tanh")``, which ORT runs in one pass
(:mod:`ort_lazy.export.activations`): a compiled call of GPT-2's formula on 256 x 4096 floats,
2 cores, 1.04 -> 0.44 ms (eager 2.4 ms); GPT-2 inference 1.18x -> 1.05x the best direct ORT run.

Only float32 is fused (ORT's fused kernel is float32 on the CPU; eager computes a written-out
float16 formula step by step in float16, which the fused kernel would not round like), and
only where no intermediate value of the formula is used elsewhere (a training graph that saves
the tanh for the backward keeps the formula: fusing would compute it twice).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from .simplify import _val

__all__ = ["fuse_tanh_gelu", "fuse_activations"]

aten = torch.ops.aten

#: sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GELU
_C = math.sqrt(2.0 / math.pi)
_K = 0.044715
#: relative tolerance on the formula's constants (models round sqrt(2 / pi) to 0.79788456 or
#: 0.7978845608: 1e-8 relative, far below float32's rounding of each step)
_RTOL = 1e-6

_ADD = {aten.add.Tensor, aten.add.Scalar}
_SUB = {aten.sub.Tensor, aten.sub.Scalar}
_MUL = {aten.mul.Tensor, aten.mul.Scalar}
_POW = {aten.pow.Tensor_Scalar}
_SUMS_AND_PRODUCTS = _ADD | _SUB | _MUL
_ARITHMETIC = _SUMS_AND_PRODUCTS | _POW

#: a polynomial: monomial (tuple of exponents, one per symbol) -> coefficient
Poly = dict[tuple[int, ...], float]


def _float32(node: Any) -> bool:
    val = _val(node)
    return val is not None and val.dtype == torch.float32


def _const(value: Any, symbols: int) -> Poly | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return {(0,) * symbols: float(value)}


def _plus(a: Poly, b: Poly, sign: float = 1.0) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0.0) + sign * c
    return {m: c for m, c in out.items() if c != 0.0}


def _times(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(x + y for x, y in zip(ma, mb))
            out[m] = out.get(m, 0.0) + ca * cb
    return {m: c for m, c in out.items() if c != 0.0}


def _evaluate(
    root: Any, symbols: dict[torch.fx.Node, Poly], count: int, nodes: dict[torch.fx.Node, Poly], limit: int = 16
) -> Poly | None:
    """``root`` as a polynomial of the ``symbols`` nodes, computed through float32 sums,
    differences, products and small integer powers only (None: it is not one); ``nodes``
    collects the ops evaluated on the way (at most ``limit``)."""
    if not isinstance(root, torch.fx.Node):
        return _const(root, count)
    if root in symbols:
        return symbols[root]
    if root in nodes:
        return nodes[root]
    if (
        root.op != "call_function"
        or root.target not in _ARITHMETIC
        or len(root.args) != 2
        or root.kwargs.get("alpha", 1) != 1
        or not _float32(root)
        or len(nodes) >= limit
    ):
        return None
    if root.target in _POW:
        base = _evaluate(root.args[0], symbols, count, nodes, limit)
        exponent = root.args[1]
        if base is None or isinstance(exponent, bool) or exponent not in (1, 2, 3):
            return None
        out = base
        for _ in range(int(exponent) - 1):
            out = _times(out, base)
    else:
        a = _evaluate(root.args[0], symbols, count, nodes, limit)
        b = _evaluate(root.args[1], symbols, count, nodes, limit) if a is not None else None
        if a is None or b is None:
            return None
        if root.target in _MUL:
            out = _times(a, b)
        else:
            out = _plus(a, b, -1.0 if root.target in _SUB else 1.0)
    nodes[root] = out
    return out


def _close(poly: Poly | None, expected: Poly) -> bool:
    if poly is None or set(poly) != set(expected):
        return False
    return all(math.isclose(poly[m], c, rel_tol=_RTOL) for m, c in expected.items())


def _arithmetic_inputs(root: torch.fx.Node, limit: int = 16) -> list[torch.fx.Node]:
    """The nodes ``root`` is computed from through sums, differences, products and powers
    (those ops and their operands), nearest first."""
    found: list[torch.fx.Node] = []
    queue = [root]
    while queue and len(found) < limit:
        node = queue.pop(0)
        if node in found:
            continue
        found.append(node)
        if node.op == "call_function" and node.target in _ARITHMETIC:
            queue.extend(a for a in node.args if isinstance(a, torch.fx.Node))
    return found


def _cubic_argument(tanh: torch.fx.Node) -> tuple[torch.fx.Node, dict[torch.fx.Node, Poly]] | None:
    """The ``x`` of ``tanh(c * (x + k * x**3))`` and the ops computing the argument from it."""
    root = tanh.args[0]
    if not isinstance(root, torch.fx.Node):
        return None
    for x in _arithmetic_inputs(root)[1:]:  # x is whichever node makes the argument a cubic
        if not _float32(x):
            continue
        nodes: dict[torch.fx.Node, Poly] = {}
        if _close(_evaluate(root, {x: {(1,): 1.0}}, 1, nodes), {(1,): _C, (3,): _C * _K}):
            return x, nodes
    return None


def _gelu_product(x: torch.fx.Node, tanh: torch.fx.Node) -> tuple[torch.fx.Node, dict[torch.fx.Node, Poly]] | None:
    """The op computing ``0.5 * x * (1 + tanh)`` from ``x`` and ``tanh``, and the ops on the way."""
    symbols = {x: {(1, 0): 1.0}, tanh: {(0, 1): 1.0}}
    wanted = {(1, 0): 0.5, (1, 1): 0.5}
    queue, seen = list(tanh.users), set()
    while queue and len(seen) < 8:  # the result is a few sums and products past the tanh
        node = queue.pop(0)
        if node in seen or node.op != "call_function" or node.target not in _SUMS_AND_PRODUCTS:
            continue
        seen.add(node)
        nodes: dict[torch.fx.Node, Poly] = {}
        if _close(_evaluate(node, symbols, 2, nodes), wanted):
            return node, nodes
        queue.extend(node.users)
    return None


def fuse_tanh_gelu(gm: torch.fx.GraphModule) -> int:
    """Replace each written-out float32 tanh-approximated GELU in ``gm`` (an aten graph) by
    ``aten.gelu(x, approximate="tanh")``, in place; returns how many were replaced."""
    fused = 0
    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # the nodes a fusion erases are all in it
    for tanh in list(gm.graph.nodes):
        if tanh.op != "call_function" or tanh.target is not aten.tanh.default or not _float32(tanh):
            continue
        argument = _cubic_argument(tanh)
        if argument is None:
            continue
        x, inner = argument
        product = _gelu_product(x, tanh)
        if product is None:
            continue
        out, outer = product
        pattern = set(inner) | set(outer) | {tanh}
        if any(user not in pattern for node in pattern - {out} for user in node.users):
            continue  # an intermediate value is used elsewhere: fusing would compute twice
        # the other operands are Python numbers: the result has x's shape (and dtype: float32)
        with gm.graph.inserting_before(out):
            gelu = gm.graph.call_function(aten.gelu.default, (x,), {"approximate": "tanh"})
        gelu.meta.update(out.meta)
        out.replace_all_uses_with(gelu)
        for node in sorted(pattern, key=order.__getitem__, reverse=True):  # users first
            gm.graph.erase_node(node)
        fused += 1
    if fused:
        gm.recompile()
    return fused


def fuse_activations(gm: torch.fx.GraphModule) -> int:
    """Every fusion of this module on ``gm``, in place; returns how many applied."""
    return fuse_tanh_gelu(gm)

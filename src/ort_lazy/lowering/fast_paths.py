"""The fused fast path of ``nn.TransformerEncoderLayer`` as ordinary ops.

``nn.TransformerEncoderLayer`` in eval / no-grad takes a fused fast path
(``torch._transformer_encoder_layer_fwd``) that the exporter cannot translate. Dynamo records it
in the graph; before AOTAutograd lowers the graph, each such call is replaced
(:func:`lower_fast_paths`) by the same computation written with ordinary functional ops
(:func:`transformer_encoder_layer`), which then runs on ORT.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .. import _compat

__all__ = ["transformer_encoder_layer", "lower_fast_paths"]


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

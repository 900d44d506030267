"""Real-model rows for the benchmark: Hugging Face transformers classes at benchmark sizes.

Random weights from configs (nothing is downloaded), dropout off, every model returning one
tensor so the suite's loss and parity checks apply unchanged. The Llama decoder is transformers'
``LlamaForCausalLM`` (RMSNorm, rotary positions, grouped key/value heads, SwiGLU) at GPT-2's size. ResNet-18, EfficientNet-B0 and
ViT come from transformers' own ``ResNet``, ``EfficientNet`` and ``ViT`` classes (the
torchvision wheel on PyPI is CUDA-linked and does not load beside the CPU torch). ``transformers`` is imported only when one of these
models is chosen.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ort_lazy.models import BuiltinModel

__all__ = ["ZOO", "ZOO_BATCH"]

#: samples per call of every zoo model (images 224x224, text 128 tokens)
ZOO_BATCH = 2
_SEQ = 128
_VOCAB = 1000
_FFN_WIDTH = 1024


class _Tensor(nn.Module):
    """Returns one field of a Hugging Face model's output as a plain tensor."""

    def __init__(self, model: nn.Module, field: str) -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.field)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=_VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        max_position_embeddings=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return _Tensor(BertModel(config, add_pooling_layer=False), "last_hidden_state")


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=_VOCAB, n_embd=256, n_layer=4, n_head=4, n_positions=256, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return _Tensor(GPT2LMHeadModel(config), "logits")


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=_VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=688, max_position_embeddings=256, use_cache=False, attention_dropout=0.0,
        tie_word_embeddings=False,
    )
    return _Tensor(LlamaForCausalLM(config), "logits")


def _resnet18() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], embedding_size=64, num_labels=10,
    )
    return _Tensor(ResNetForImageClassification(config), "logits")


def _vit_tiny() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768, image_size=224,
        patch_size=16, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return _Tensor(ViTForImageClassification(config), "logits")


def _efficientnet_b0() -> nn.Module:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    # B0's widths and depths (the config's defaults are B7's), SiLU ("swish") activations
    config = EfficientNetConfig(
        image_size=224, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, dropout_rate=0.0,
        drop_connect_rate=0.0, num_labels=10,
    )
    model = EfficientNetForImageClassification(config)
    # transformers draws batch-norm scales from N(0, 0.02) with statistics at mean 0, variance
    # 1: features shrink to subnormal numbers (slow arithmetic) and every logit is 0. Unit
    # scales and one batch's statistics (momentum None: exactly that batch's) keep them near 1.
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_parameters()
        norm.momentum = None
    with torch.no_grad():
        model.train()(torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(7)))
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    return _Tensor(model, "logits")


def _ffn() -> nn.Module:
    return nn.Sequential(nn.Linear(_FFN_WIDTH, 4 * _FFN_WIDTH), nn.GELU(), nn.Linear(4 * _FFN_WIDTH, _FFN_WIDTH))


def _hidden_states() -> tuple[torch.Tensor, ...]:
    return (torch.randn(ZOO_BATCH, _SEQ, _FFN_WIDTH),)


def _tokens() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, _VOCAB, (ZOO_BATCH, _SEQ)),)


def _images() -> tuple[torch.Tensor, ...]:
    return (torch.randn(ZOO_BATCH, 3, 224, 224),)


def _entry(name: str, make: Callable[[], nn.Module], inputs: Callable[[], tuple[torch.Tensor, ...]], text: str) -> BuiltinModel:
    return BuiltinModel(name, make, inputs, text)


#: The zoo rows ``bench.py --models`` accepts beside the built-in models.
ZOO: dict[str, BuiltinModel] = {
    "bert": _entry("bert", _bert, _tokens, f"BertModel, 4 layers, hidden 256, batch {ZOO_BATCH} x {_SEQ} tokens"),
    "gpt2": _entry("gpt2", _gpt2, _tokens, f"GPT2LMHeadModel, 4 layers, n_embd 256, batch {ZOO_BATCH} x {_SEQ} tokens"),
    "llama": _entry(
        "llama", _llama, _tokens,
        f"LlamaForCausalLM decoder, 4 layers, hidden 256, 4 heads sharing 2 key/value heads, SwiGLU 688, "
        f"batch {ZOO_BATCH} x {_SEQ} tokens",
    ),
    "resnet": _entry("resnet", _resnet18, _images, f"ResNet-18 (transformers ResNet), batch {ZOO_BATCH} x 3x224x224"),
    "ffn": _entry("ffn", _ffn, _hidden_states, f"Transformer feed-forward block {_FFN_WIDTH} -> {4 * _FFN_WIDTH} -> {_FFN_WIDTH}, GELU, batch {ZOO_BATCH} x {_SEQ} tokens"),
    "efficientnet": _entry(
        "efficientnet", _efficientnet_b0, _images,
        f"EfficientNet-B0 (transformers EfficientNet, SiLU), batch {ZOO_BATCH} x 3x224x224",
    ),
    "vit": _entry("vit", _vit_tiny, _images, f"ViT-Tiny/16 (transformers ViT), batch {ZOO_BATCH} x 3x224x224"),
}

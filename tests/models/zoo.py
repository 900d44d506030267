"""The model zoo: small random-weight models built from the libraries' own classes.

Every case builds its model from a config (transformers) or a model name / class (timm) with
random weights: nothing is downloaded. Sizes are tiny (hidden 32, 1-2 layers, 32x32 or 64x64
images) so one test takes seconds, and every batch holds at least 2 samples, so bugs that
depend on the batch size show. Dropout is off everywhere, so eager and compiled training
steps see the same function. Classifiers set ``problem_type`` up front: transformers would set
it on the first call and so make dynamo recompile on the second.

A case gives the model, its inputs, and the integer labels of a training step; the loss is
computed inside the compiled function (the Hugging Face model's own ``labels=`` loss, or
:class:`ClassifierLoss` with a mean cross-entropy for timm classifiers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torchvision_stub import import_timm

VOCAB = 96
BATCH = 2


@dataclass(frozen=True)
class ModelCase:
    """One zoo model: how to build it, its inputs, and what a training step feeds it."""

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]
    # the labels of a training step; the loss is the model's own (HF) or ClassifierLoss's
    labels: Callable[[torch.Generator], torch.Tensor]
    # output fields compared in inference (a plain tensor output when empty)
    outputs: tuple[str, ...] = ("logits",)
    family: str = "transformers"

    def model(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build()

    def train_model(self) -> torch.nn.Module:
        """A module whose forward(**inputs, labels=...) returns the scalar training loss."""
        model = self.model()
        return model if self.family == "transformers" else ClassifierLoss(model)


class ClassifierLoss(torch.nn.Module):
    """``F.cross_entropy(model(x), labels)`` with ``reduction="mean"``, inside the compiled graph."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(x), labels, reduction="mean")


# -- inputs -----------------------------------------------------------------------------------


def _tokens(length: int) -> Callable[[torch.Generator], torch.Tensor]:
    def make(gen: torch.Generator) -> torch.Tensor:
        return torch.randint(1, VOCAB, (BATCH, length), generator=gen)

    return make


def _text(length: int, padded: bool = False) -> Callable[[torch.Generator], dict[str, torch.Tensor]]:
    """input_ids (and an attention mask whose last row is right-padded, when ``padded``)."""

    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, VOCAB, (BATCH, length), generator=gen)
        if not padded:
            return {"input_ids": ids}
        mask = torch.ones(BATCH, length, dtype=torch.long)
        mask[-1, length - 3 :] = 0
        ids = ids.masked_fill(mask == 0, 0)
        return {"input_ids": ids, "attention_mask": mask}

    return make


def _seq2seq(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.randint(1, VOCAB, (BATCH, 10), generator=gen),
        "decoder_input_ids": torch.randint(1, VOCAB, (BATCH, 6), generator=gen),
    }


def _speech(gen: torch.Generator) -> dict[str, torch.Tensor]:
    # Whisper's encoder wants exactly 2 * max_source_positions mel frames
    return {
        "input_features": torch.randn(BATCH, 16, 32, generator=gen),
        "decoder_input_ids": torch.randint(1, VOCAB, (BATCH, 6), generator=gen),
    }


def _image(size: int, key: str = "pixel_values") -> Callable[[torch.Generator], dict[str, torch.Tensor]]:
    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {key: torch.randn(BATCH, 3, size, size, generator=gen)}

    return make


def _classes(n: int) -> Callable[[torch.Generator], torch.Tensor]:
    def make(gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, n, (BATCH,), generator=gen)

    return make


# -- models -----------------------------------------------------------------------------------


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


#: sizes of the zoo's grouped-query decoders (Llama, Mistral, Qwen2: the same config fields)
_GQA_DECODER = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**_GQA_DECODER)
    return LlamaForCausalLM(config)


def _t5() -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )
    return T5ForConditionalGeneration(config)


def _whisper() -> torch.nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=16, max_target_positions=32, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None,
    )
    return WhisperForConditionalGeneration(config)


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=5, problem_type="single_label_classification",
    )
    return BertForSequenceClassification(config)


def _distilbert() -> torch.nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=5,
        problem_type="single_label_classification",
    )
    return DistilBertForSequenceClassification(config)


def _vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=10, problem_type="single_label_classification",
    )
    return ViTForImageClassification(config)


def _resnet() -> torch.nn.Module:
    # resnet18's blocks and depths (BasicBlock x (2, 2, 2, 2), 7x7 stem, max pooling), 1/4 the width
    return import_timm().create_model(
        "resnet18", pretrained=False, num_classes=10, stem_width=16, channels=(16, 32, 64, 128)
    )


def _mobilenet() -> torch.nn.Module:
    # depthwise convolutions, squeeze-excite with hard-sigmoid, hard-swish, BatchNorm
    return import_timm().create_model("mobilenetv3_small_050", pretrained=False, num_classes=10)


def _convnext() -> torch.nn.Module:
    # convnext_atto's block (7x7 depthwise conv, LayerNorm2d, conv MLP, layer scale), smaller
    timm = import_timm()
    return timm.models.convnext.ConvNeXt(depths=(1, 1, 2, 1), dims=(16, 32, 64, 128), conv_mlp=True, num_classes=10)


def _mistral() -> torch.nn.Module:
    # grouped-query attention with a sliding window shorter than the sequence
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**_GQA_DECODER, sliding_window=8)
    return MistralForCausalLM(config)


def _qwen2() -> torch.nn.Module:
    # biased q/k/v projections, grouped-query attention
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**_GQA_DECODER)
    return Qwen2ForCausalLM(config)


def _phi() -> torch.nn.Module:
    # rotary embedding on part of each head, LayerNorm, parallel attention and MLP
    from transformers import PhiConfig, PhiForCausalLM

    config = PhiConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
    )
    return PhiForCausalLM(config)


def _gemma() -> torch.nn.Module:
    # multi-query attention, GeGLU, RMSNorm scaled by (1 + weight), scaled embeddings
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
    )
    return GemmaForCausalLM(config)


def _roberta() -> torch.nn.Module:
    # position ids from the padding mask (cumsum), classification head on the first token
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=5,
        problem_type="single_label_classification", pad_token_id=0,
    )
    return RobertaForSequenceClassification(config)


def _albert() -> torch.nn.Module:
    # one layer's weights shared by every layer, factorized embeddings
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, num_labels=5,
        problem_type="single_label_classification",
    )
    return AlbertForSequenceClassification(config)


def _efficientnet() -> torch.nn.Module:
    # SiLU, squeeze-excite, depthwise and inverted-residual blocks, drop-path off in eval
    return import_timm().create_model("efficientnet_b0", pretrained=False, num_classes=10)


def _regnet() -> torch.nn.Module:
    # grouped convolutions
    return import_timm().create_model("regnetx_002", pretrained=False, num_classes=10)


def _swin() -> torch.nn.Module:
    # shifted-window attention (roll, window partition views, relative position bias)
    return import_timm().create_model(
        "swin_tiny_patch4_window7_224", pretrained=False, num_classes=10, img_size=56, embed_dim=32,
        depths=(1, 1), num_heads=(2, 4), window_size=7,
        drop_path_rate=0.0,  # timm's Swin drops residual paths at random (0.1) by default; parity needs none
    )


# -- more families: the architectures users bring beyond the first nineteen ---------------------


def _hf(model_class: str, config_class: str, **config: Any) -> Callable[[], torch.nn.Module]:
    """A transformers model built from its config class with ``config``."""

    def build() -> torch.nn.Module:
        import transformers

        return getattr(transformers, model_class)(getattr(transformers, config_class)(**config))

    return build


def _timm(name: str, **kwargs: Any) -> Callable[[], torch.nn.Module]:
    return lambda: import_timm().create_model(name, pretrained=False, num_classes=10, **kwargs)


_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_CLASSIFIER = dict(num_labels=5, problem_type="single_label_classification")
_IMAGE_CLASSIFIER = dict(num_labels=10, problem_type="single_label_classification")

_BART = _hf(
    "BartForConditionalGeneration", "BartConfig", vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
    max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, pad_token_id=0, decoder_start_token_id=2,
)  # learned positions with an offset, shifted decoder inputs
_OPT = _hf(
    "OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0,
)  # positions from the attention mask's cumsum
_BLOOM = _hf(
    "BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4,
    hidden_dropout=0.0, attention_dropout=0.0,
)  # ALiBi position biases, baddbmm attention, fused query/key/value
_GPT_NEOX = _hf(
    "GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, rotary_pct=0.5,
)  # rotary embedding on a quarter of each head, parallel residual
_FALCON = _hf(
    "FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0,
)  # multi-query attention, parallel attention and MLP
_GPT_BIGCODE = _hf(
    "GPTBigCodeForCausalLM", "GPTBigCodeConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
    multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
)  # multi-query attention with a packed key/value
_GEMMA2 = _hf(
    "Gemma2ForCausalLM", "Gemma2Config", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    sliding_window=8,
)  # logit soft-capping (tanh), alternating sliding-window layers, sandwich norms
_QWEN3 = _hf(
    "Qwen3ForCausalLM", "Qwen3Config", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
)  # RMSNorm on queries and keys per head
_ELECTRA = _hf(
    "ElectraForSequenceClassification", "ElectraConfig", vocab_size=VOCAB, embedding_size=16, hidden_size=32,
    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
    **_NO_DROPOUT, **_CLASSIFIER,
)  # embeddings projected up, GELU classification head
_DEBERTA_V2 = _hf(
    "DebertaV2ForSequenceClassification", "DebertaV2Config", vocab_size=VOCAB, hidden_size=32,
    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
    relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=16, position_buckets=8,
    pooler_dropout=0.0, **_NO_DROPOUT, **_CLASSIFIER,
)  # disentangled attention: log-bucketed relative positions gathered into the scores
_WAV2VEC2 = _hf(
    "Wav2Vec2ForCTC", "Wav2Vec2Config", vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, ctc_loss_reduction="mean",
    pad_token_id=0,
)  # strided 1-d convolutions, group norm, weight-normed positional convolution, CTC loss
_SEGFORMER = _hf(
    "SegformerForSemanticSegmentation", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
    hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
    decoder_hidden_size=32, num_labels=4, classifier_dropout_prob=0.0, drop_path_rate=0.0, **_NO_DROPOUT,
)  # overlapping patch embeddings, reduced-key attention, bilinear upsampling, per-pixel loss
_BEIT = _hf(
    "BeitForImageClassification", "BeitConfig", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=4, intermediate_size=64, use_relative_position_bias=True, drop_path_rate=0.0,
    **_NO_DROPOUT, **_IMAGE_CLASSIFIER,
)  # relative position bias tables indexed per head, layer scale


def _batch_statistics(build: Callable[[], torch.nn.Module], size: int) -> Callable[[], torch.nn.Module]:
    """``build`` with unit batch-norm scales and the statistics of one batch of other images.

    transformers draws batch-norm scales from N(0, 0.02) and leaves the statistics at mean 0,
    variance 1: features shrink by 1e-2 to 1e-7 a block, every logit was 0 in eval mode
    (EfficientNet, MobileViT) and inference parity compared zeros. With momentum None the
    running statistics become that batch's exactly.
    """

    def fixed() -> torch.nn.Module:
        model = build()
        norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        momenta = [m.momentum for m in norms]
        for norm in norms:
            norm.reset_parameters()
            norm.momentum = None
        with torch.no_grad():
            model.train()(pixel_values=torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(7)))
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum
        return model

    return fixed


# depthwise convolutions (padding="valid" and "same"), SiLU, squeeze-excite; global pooling as
# AvgPool2d(hidden_dim, ceil_mode=True), a window far larger than its 1 x 1 map
_EFFICIENTNET_HF = _batch_statistics(_hf(
    "EfficientNetForImageClassification", "EfficientNetConfig", image_size=32, width_coefficient=0.25,
    depth_coefficient=0.25, hidden_dim=320, dropout_rate=0.0, drop_connect_rate=0.0, **_IMAGE_CLASSIFIER,
), 32)
_MOBILEVIT = _batch_statistics(_hf(
    "MobileViTForImageClassification", "MobileViTConfig", image_size=64, hidden_sizes=[16, 24, 32],
    neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], classifier_dropout_prob=0.0, **_NO_DROPOUT,
    **_IMAGE_CLASSIFIER,
), 64)  # convolutions around transformers over unfolded patches (interpolate, reshapes)


_FUNNEL = _hf(
    "FunnelForSequenceClassification", "FunnelConfig", vocab_size=VOCAB, block_sizes=[1, 1], num_decoder_layers=1,
    d_model=32, n_head=2, d_head=16, d_inner=64, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    **_CLASSIFIER,
)  # pooled blocks, relative positions shifted by a reshape of a slice written into a permuted tensor
_XLNET = _hf(
    "XLNetForSequenceClassification", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64,
    dropout=0.0, summary_last_dropout=0.0, **_CLASSIFIER,
)  # two-stream relative attention, ``1.0 - attention_mask`` on the integer mask
_CLIP = _hf(
    "CLIPForImageClassification", "CLIPConfig",
    vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4),
    text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
    **_IMAGE_CLASSIFIER,
)  # quick-GELU, pre-layer-norm, class embedding


def _densenet() -> torch.nn.Module:
    # concatenated feature maps, BatchNorm before each convolution, average-pool transitions
    return import_timm().models.densenet.DenseNet(growth_rate=8, block_config=(2, 2), num_classes=10, stem_type="")


def _mixer() -> torch.nn.Module:
    # token-mixing MLPs across the transposed patch axis
    model = import_timm().models.mlp_mixer.MlpMixer(num_classes=10, img_size=64, patch_size=16, num_blocks=2, embed_dim=32)
    # timm starts the head at zero (every logit 0: inference parity compared zeros)
    model.head.reset_parameters()
    return model


def _poolformer() -> torch.nn.Module:
    # average pooling as the token mixer, GroupNorm with one group, adaptive pooling restrided by as_strided
    metaformer = import_timm().models.metaformer
    return metaformer.MetaFormer(
        depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), token_mixers=metaformer.Pooling,
        norm_layers=metaformer.GroupNorm1, num_classes=10,
    )


def _maxvit() -> torch.nn.Module:
    # block and grid attention with relative position MLPs, MBConv; the relative position MLP's
    # dropout (0.1) has no constructor argument
    model = _timm("maxvit_rmlp_pico_rw_256", img_size=64)()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _lm_labels(length: int) -> Callable[[torch.Generator], torch.Tensor]:
    return _tokens(length)


def _audio(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"input_values": torch.randn(BATCH, 800, generator=gen)}


def _ctc_labels(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(1, 20, (BATCH, 3), generator=gen)


def _segmentation_labels(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 4, (BATCH, 32, 32), generator=gen)


CASES: dict[str, ModelCase] = {
    c.name: c
    for c in [
        ModelCase("gpt2", _gpt2, _text(12), _lm_labels(12)),
        ModelCase("llama", _llama, _text(12), _lm_labels(12)),
        ModelCase("t5", _t5, _seq2seq, _lm_labels(6), outputs=("logits", "encoder_last_hidden_state")),
        ModelCase("whisper", _whisper, _speech, _lm_labels(6), outputs=("logits", "encoder_last_hidden_state")),
        ModelCase("bert", _bert, _text(12, padded=True), _classes(5)),
        ModelCase("distilbert", _distilbert, _text(12, padded=True), _classes(5)),
        ModelCase("vit", _vit, _image(32), _classes(10)),
        ModelCase("resnet", _resnet, _image(32, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("mobilenet", _mobilenet, _image(64, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("convnext", _convnext, _image(32, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("mistral", _mistral, _text(12), _lm_labels(12)),
        ModelCase("qwen2", _qwen2, _text(12), _lm_labels(12)),
        ModelCase("phi", _phi, _text(12), _lm_labels(12)),
        ModelCase("gemma", _gemma, _text(12), _lm_labels(12)),
        ModelCase("roberta", _roberta, _text(12, padded=True), _classes(5)),
        ModelCase("albert", _albert, _text(12, padded=True), _classes(5)),
        ModelCase("efficientnet", _efficientnet, _image(64, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("regnet", _regnet, _image(64, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("swin", _swin, _image(56, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("bart", _BART, _seq2seq, _lm_labels(6)),
        ModelCase("opt", _OPT, _text(12), _lm_labels(12)),
        ModelCase("bloom", _BLOOM, _text(12, padded=True), _lm_labels(12)),
        ModelCase("gpt_neox", _GPT_NEOX, _text(12), _lm_labels(12)),
        ModelCase("falcon", _FALCON, _text(12), _lm_labels(12)),
        ModelCase("gpt_bigcode", _GPT_BIGCODE, _text(12), _lm_labels(12)),
        ModelCase("gemma2", _GEMMA2, _text(12), _lm_labels(12)),
        ModelCase("qwen3", _QWEN3, _text(12), _lm_labels(12)),
        ModelCase("electra", _ELECTRA, _text(12, padded=True), _classes(5)),
        ModelCase("deberta_v2", _DEBERTA_V2, _text(12, padded=True), _classes(5)),
        ModelCase("wav2vec2", _WAV2VEC2, _audio, _ctc_labels),
        ModelCase("segformer", _SEGFORMER, _image(32), _segmentation_labels),
        ModelCase("beit", _BEIT, _image(32), _classes(10)),
        ModelCase("mobilevit", _MOBILEVIT, _image(64), _classes(10)),
        ModelCase("clip", _CLIP, _image(32), _classes(10)),
        ModelCase("efficientnet_hf", _EFFICIENTNET_HF, _image(32), _classes(10)),
        ModelCase("funnel", _FUNNEL, _text(12, padded=True), _classes(5)),
        ModelCase("xlnet", _XLNET, _text(12, padded=True), _classes(5)),
        ModelCase("densenet", _densenet, _image(32, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("mixer", _mixer, _image(64, "x"), _classes(10), outputs=(), family="timm"),
        ModelCase("poolformer", _poolformer, _image(64, "x"), _classes(10), outputs=(), family="timm"),
        # distillation token, two heads averaged in eval
        ModelCase("deit", _timm("deit_tiny_distilled_patch16_224", img_size=32, embed_dim=32, depth=2, num_heads=2),
                  _image(32, "x"), _classes(10), outputs=(), family="timm"),
        # attention with learned biases gathered by offset, BatchNorm after linear layers, hard-swish
        ModelCase("levit", _timm("levit_128s", img_size=64), _image(64, "x"), _classes(10), outputs=(), family="timm"),
        # weight-standardized convolutions (normalized weights every call), no BatchNorm
        ModelCase("nfnet", _timm("nf_resnet26", channels=(16, 32, 64, 128)), _image(32, "x"), _classes(10),
                  outputs=(), family="timm"),
        # max pooling stacks, adaptive pooling to 7 x 7 from 1 x 1
        ModelCase("vgg", _timm("vgg11"), _image(32, "x"), _classes(10), outputs=(), family="timm"),
        # ghost modules (cheap depthwise features concatenated), squeeze-excite
        ModelCase("ghostnet", _timm("ghostnet_050", drop_rate=0.0), _image(64, "x"), _classes(10), outputs=(),
                  family="timm"),
        ModelCase("maxvit", _maxvit, _image(64, "x"), _classes(10), outputs=(), family="timm"),
        # hierarchical aggregation trees (concatenation of levels)
        ModelCase("dla", _timm("dla34"), _image(64, "x"), _classes(10), outputs=(), family="timm"),
        # separable convolutions in entry/middle/exit flows
        ModelCase("xception", _timm("xception41"), _image(64, "x"), _classes(10), outputs=(), family="timm"),
        # parallel branches of asymmetric convolutions, auxiliary-free
        ModelCase("inception", _timm("inception_v3"), _image(96, "x"), _classes(10), outputs=(), family="timm"),
        # rotary position embedding on image patches, SwiGLU
        ModelCase("eva", _timm("eva02_tiny_patch14_224", img_size=28, embed_dim=32, depth=2, num_heads=2),
                  _image(28, "x"), _classes(10), outputs=(), family="timm"),
    ]
}


#: The default run's subset: an encoder, a decoder and a CNN (about a minute on 2 cores);
#: ``--zoo-full`` adds the rest.
FAST = ("bert", "gpt2", "resnet")


def outputs_of(case: ModelCase, out: Any) -> list[torch.Tensor]:
    """The tensors compared in inference: the named fields, or the tensor itself."""
    if not case.outputs:
        return [out]
    return [getattr(out, f) for f in case.outputs]

"""CPU attention as ONNX's ``Attention`` (``ort_lazy.export.attention``): eager's numbers for
every form of ``scaled_dot_product_attention`` inference graphs hold (masks broadcast over rows,
fully masked rows, causal with more or fewer queries than keys, custom scales, cross attention,
symbolic lengths), ORT running the fused op (counted), the rest decomposed and still on ORT,
and the decomposed form where a model cannot take opset 23."""

from __future__ import annotations

import logging
import math

import onnx
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, captured_exports, compile_ort
from ort_lazy import metrics
from ort_lazy.export import attention

_NEG = -math.inf


def _op_types(model: object) -> list[str]:
    return [n.op_type for n in onnx.load_from_string(model.model_bytes).graph.node]


def _masks() -> dict[str, tuple[tuple[int, ...], torch.Tensor | None, dict[str, object]]]:
    """name -> (query/key lengths, mask, sdpa keywords)."""
    g = torch.Generator().manual_seed(0)
    padded = torch.zeros(2, 1, 1, 7)
    padded[0, ..., 5:] = _NEG  # key padding, one row for every query
    rows = torch.randn(2, 1, 6, 7, generator=g)
    rows[1, 0, 2] = _NEG  # a query that sees no key: 0 in eager
    rows[0, 0, 4, :3] = _NEG
    keep = torch.rand(6, 7, generator=g) > 0.3
    keep[3] = False
    return {
        "none": ((6, 7), None, {}),
        "key-padding": ((6, 7), padded, {}),
        "per-row-with-masked-rows": ((6, 7), rows, {}),
        "2d-bool-with-a-masked-row": ((6, 7), keep, {}),
        "one-row": ((6, 7), torch.randn(1, 7, generator=g), {}),
        "per-head": ((6, 6), torch.randn(1, 3, 6, 6, generator=g), {}),
        "causal": ((6, 6), None, {"is_causal": True}),
        "causal-fewer-queries": ((4, 7), None, {"is_causal": True}),
        "causal-more-queries": ((7, 4), None, {"is_causal": True}),
        "scale": ((6, 7), padded, {"scale": 0.3}),
    }


@pytest.mark.parametrize("case", list(_masks()))
def test_cpu_attention_runs_as_one_onnx_attention_with_eager_s_numbers(case: str) -> None:
    (length, keys), mask, kwargs = _masks()[case]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, length, 8, generator=g)
    k = torch.randn(2, 3, keys, 8, generator=g)
    v = torch.randn(2, 3, keys, 8, generator=g)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, *mask, **kwargs) * 2

    args = (q, k, v) + ((mask,) if mask is not None else ())
    with captured_exports() as models, torch.no_grad():
        got = compile_ort(attend)(*args)
        want = attend(*args)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    if "masked-row" in case:
        assert (want == 0).all(dim=-1).any(), "the case must hold a fully masked row"
    c = metrics.counters()
    assert c["ort_runs"] == 1 and c["fused_attention"] == 1 and c["fallback_ops"] == 0, (c, metrics.fallbacks())
    assert _op_types(models[-1]).count("Attention") == 1
    assert onnx.load_from_string(models[-1].model_bytes).opset_import[0].version >= attention.ATTENTION_OPSET


def test_projected_attention_keeps_eager_s_numbers_for_symbolic_lengths() -> None:
    """Heads split from projections (the layout the translation hands back to ORT), with the
    batch and sequence lengths symbolic: one model for every length, padding masks expanded
    over a length known only at run time."""
    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()

    def attend(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(pad.shape, dtype=x.dtype).masked_fill(pad, _NEG)[:, None, None, :]
        b, s, _ = x.shape
        q, k, v = F.linear(x, layer.in_proj_weight, layer.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, 4, 8).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, 32)
        return layer.out_proj(out)

    compiled = compile_ort(attend, dynamic=True)
    with torch.no_grad():
        for batch, seq in ((2, 9), (3, 12), (1, 5)):
            x = torch.randn(batch, seq, 32)
            pad = torch.zeros(batch, seq, dtype=torch.bool)
            pad[0, seq - 2 :] = True
            assert_close(compiled(x, pad), attend(x, pad), rtol=1e-5, atol=1e-6)
    c = metrics.counters()
    assert c["fused_attention"] >= 1 and c["ort_runs"] == 3 and c["torch_runs"] == 0, c


def test_attention_logsumexp_output_is_eager_s() -> None:
    """The op's second output (read only by code calling it itself), masked rows included."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5, generator=g)
    mask[0, 0, 1] = _NEG

    def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, attn_mask=mask)[:2]
        causal, causal_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, is_causal=True)[:2]
        return out, lse, causal, causal_lse

    with torch.no_grad():
        got = compile_ort(flash)(q, k, v, mask)
        want = flash(q, k, v, mask)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert metrics.counters()["fused_attention"] == 2 and metrics.counters()["fallback_ops"] == 0


@pytest.mark.parametrize(
    "dtype, kwargs",
    [(torch.float64, {}), (torch.float16, {}), (torch.bfloat16, {}), (torch.float32, {"enable_gqa": True})],
    ids=["float64", "float16", "bfloat16", "grouped-heads"],
)
def test_attention_the_op_cannot_take_is_decomposed_and_runs_on_ort(dtype: torch.dtype, kwargs: dict) -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=g).to(dtype)
    heads = 2 if kwargs else 4
    k = torch.randn(2, heads, 6, 8, generator=g).to(dtype)
    v = torch.randn(2, heads, 6, 8, generator=g).to(dtype)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    with torch.no_grad():
        got = compile_ort(attend)(q, k, v)
        want = attend(q, k, v)
    tol = 1e-6 if dtype in (torch.float32, torch.float64) else 2e-2
    assert_close(got, want, rtol=tol, atol=tol)
    c = metrics.counters()
    assert c["ort_runs"] == 1 and c["fused_attention"] == 0 and c["fallback_ops"] == 0, (c, metrics.fallbacks())


def test_attention_stays_decomposed_where_the_model_cannot_take_opset_23(monkeypatch, caplog) -> None:
    import onnxscript.version_converter as converter

    def refuse(model: object, target_version: int) -> None:
        raise RuntimeError("injected conversion fault")

    monkeypatch.setattr(converter, "convert_version", refuse)
    q = torch.randn(2, 2, 5, 4)
    mask = torch.zeros(2, 1, 5, 5)
    mask[1, 0, 3] = _NEG

    def attend(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    with caplog.at_level(logging.WARNING, logger="ort_lazy"), captured_exports() as models, torch.no_grad():
        got = compile_ort(attend)(q, mask)
    assert_close(got, attend(q, mask), rtol=1e-5, atol=1e-6)
    c = metrics.counters()
    assert c["ort_runs"] == 1 and c["fused_attention"] == 0 and c["fallback_ops"] == 0, c
    assert "Attention" not in _op_types(models[-1])
    assert "injected conversion fault" in caplog.text


def test_training_attention_is_decomposed(monkeypatch) -> None:
    """With gradients the graph traces attention by the math path (its backward is ordinary
    ops ORT runs): no ``Attention``, eager's gradients."""
    g = torch.Generator().manual_seed(4)
    q0 = torch.randn(2, 2, 5, 4, generator=g)

    def loss(q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q * 2, q, is_causal=True).square().sum()

    q = q0.clone().requires_grad_()
    compile_ort(loss)(q).backward()
    want = q0.clone().requires_grad_()
    loss(want).backward()
    assert_close(q.grad, want.grad, rtol=1e-5, atol=1e-6)
    assert metrics.counters()["fused_attention"] == 0 and metrics.counters()["ort_runs"] >= 2


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_hugging_face_attention_with_padding_masks_is_eager_s(family: str) -> None:
    """A Hugging Face encoder and decoder (random weights from configs) with right and left
    padding: their SDPA masks (key padding, and causal with padded queries that see no key)
    run as ONNX's ``Attention`` with eager's values."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    if family == "bert":
        config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        model = BertModel(config, add_pooling_layer=False).eval()
    else:
        model = GPT2Model(GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4)).eval()
    ids = torch.randint(0, 100, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, 8:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = compile_ort(model)(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    c = metrics.counters()
    assert c["fused_attention"] == 2 and c["ort_runs"] >= 1 and c["fallback_ops"] == 0, (c, metrics.fallbacks())

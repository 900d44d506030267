"""Where users already turn a compiler on: the ``onnxrt`` name, Hugging Face's Trainer and accelerate.

accelerate accepts only the names of its ``DynamoBackend`` enum, which still lists ``ONNXRT``
(PyTorch's removed ONNX Runtime backend); Hugging Face's ``TrainingArguments(torch_compile_backend=
...)`` goes through it. ort-lazy registers ``onnxrt`` beside ``ort``, so both reach it. Each test
runs the same seeded job eagerly and through ``onnxrt`` and compares: the losses of every step,
evaluation, generated tokens; and the metrics prove ORT ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnxruntime
import pytest
import torch

from helpers import assert_close
from ort_lazy import metrics
from ort_lazy.frontends.onnxrt import LEGACY_OPTIONS, OrtBackendOptions, translate_options
from ort_lazy.options import Options, OptionsError

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

VOCAB = 96


class _Tokens(torch.utils.data.Dataset):
    """Seeded token rows with class labels (``classes``) or as language-model labels."""

    def __init__(self, n: int, length: int = 12, classes: int | None = 5) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, length), generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g) if classes else self.ids.clone()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        problem_type="single_label_classification",
    )
    return transformers.BertForSequenceClassification(config)


def _decoder() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=None, pad_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def _arguments(tmp_path: Any, backend: str | None, cls: Any = None, **extra: Any) -> Any:
    compile_args = {"torch_compile": True, "torch_compile_backend": backend} if backend else {}
    return (cls or transformers.TrainingArguments)(
        output_dir=str(tmp_path / (backend or "eager")), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=4, logging_steps=1, seed=0, report_to=[], use_cpu=True, save_strategy="no", learning_rate=1e-3,
        dataloader_num_workers=0, disable_tqdm=True, **compile_args, **extra,
    )


def _train(tmp_path: Any, backend: str | None) -> tuple[list[float], dict[str, float]]:
    trainer = transformers.Trainer(
        model=_classifier(), args=_arguments(tmp_path, backend), train_dataset=_Tokens(16), eval_dataset=_Tokens(8)
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, trainer.evaluate()


def test_both_names_are_registered() -> None:
    backends = torch._dynamo.list_backends()
    assert "ort" in backends and "onnxrt" in backends, backends
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    x = torch.randn(3, 4)
    assert_close(torch.compile(model, backend="onnxrt")(x), model(x))
    assert metrics.counters()["ort_runs"] > 0


def test_trainer_with_onnxrt_trains_like_eager(tmp_path: Any) -> None:
    """``TrainingArguments(torch_compile=True, torch_compile_backend="onnxrt")``: every logged
    loss is eager's (same seed, the zoo's bound), the forward and backward graphs ran on ORT,
    and evaluation after training gives eager's loss."""
    eager_losses, eager_eval = _train(tmp_path, None)
    metrics.reset()
    losses, evaluated = _train(tmp_path, "onnxrt")
    c = metrics.counters()
    assert c["graphs_compiled"] >= 2 and c["ort_runs"] >= 8 and not c["fallback_ops"], (c, metrics.fallbacks())
    assert len(losses) == len(eager_losses) == 4
    assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-4, atol=1e-5)
    assert evaluated["eval_loss"] == pytest.approx(eager_eval["eval_loss"], rel=1e-4)


def test_trainer_evaluation_runs_on_ort(tmp_path: Any) -> None:
    """A Trainer that only evaluates compiles the model for evaluation: eager's loss, on ORT."""
    def evaluate(backend: str | None) -> float:
        trainer = transformers.Trainer(model=_classifier(), args=_arguments(tmp_path, backend), eval_dataset=_Tokens(8))
        return trainer.evaluate()["eval_loss"]

    expected = evaluate(None)
    metrics.reset()
    assert evaluate("onnxrt") == pytest.approx(expected, rel=1e-4)
    assert metrics.counters()["ort_runs"] > 0


def test_seq2seq_trainer_generates_eagers_tokens(tmp_path: Any) -> None:
    """``predict_with_generate`` through a Trainer compiled with ``onnxrt``: the same tokens as
    eager's, and ORT ran the model's forward for the loss it reports."""
    def predict(backend: str | None) -> Any:
        model = _decoder()
        model.generation_config = transformers.GenerationConfig(
            max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None
        )
        args = _arguments(tmp_path, backend, transformers.Seq2SeqTrainingArguments, predict_with_generate=True)
        return transformers.Seq2SeqTrainer(model=model, args=args).predict(_Tokens(4, length=8, classes=None))

    expected = predict(None)
    metrics.reset()
    got = predict("onnxrt")
    assert (got.predictions == expected.predictions).all()
    assert len({tuple(row) for row in expected.predictions.tolist()}) > 1  # tokens, not padding
    assert got.metrics["test_loss"] == pytest.approx(expected.metrics["test_loss"], rel=1e-4)
    assert metrics.counters()["ort_runs"] > 0


def _accelerated_loop(plugin: Any | None) -> list[float]:
    """A plain training loop prepared by ``Accelerator``; the losses of four steps."""
    from accelerate import Accelerator

    accelerate.state.AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin) if plugin is not None else Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(4)]
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses


def test_accelerator_with_onnxrt_trains_like_eager() -> None:
    from accelerate.utils import TorchDynamoPlugin

    expected = _accelerated_loop(None)
    metrics.reset()
    got = _accelerated_loop(TorchDynamoPlugin(backend="onnxrt"))
    assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    c = metrics.counters()
    assert c["graphs_compiled"] >= 2 and c["ort_runs"] >= 8, c


def test_options_reach_ort_lazy_through_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    """What accelerate's dynamo plugin forwards (``options``, ``mode``) and ``ORT_LAZY_*``
    variables reach the backend: an op kept in PyTorch by each, counted as kept."""
    from accelerate.utils import TorchDynamoPlugin

    _accelerated_loop(TorchDynamoPlugin(backend="onnxrt", options={"torch_executed_ops": ["aten.gelu"]}))
    assert "aten.gelu.default" in metrics.fallbacks(), metrics.fallbacks()
    metrics.reset()
    monkeypatch.setenv("ORT_LAZY_TORCH_EXECUTED_OPS", "aten.native_layer_norm")
    torch._dynamo.reset()
    _accelerated_loop(TorchDynamoPlugin(backend="onnxrt"))
    assert "aten.native_layer_norm.default" in metrics.fallbacks(), metrics.fallbacks()
    assert metrics.counters()["ort_runs"] > 0


# --------------------------------------------------------------------------- the removed backend's options


def test_legacy_options_are_mapped() -> None:
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    legacy = OrtBackendOptions(
        preferred_execution_providers=[("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})],
        ort_session_options=so, preallocate_output=True,
    )
    options = Options(**translate_options(legacy))
    assert options.providers == ("CPUExecutionProvider",)
    assert options.provider_options == {"CPUExecutionProvider": {"arena_extend_strategy": "kSameAsRequested"}}
    assert options.session_options == {"intra_op_num_threads": 1, "graph_optimization_level": "ORT_ENABLE_BASIC"}
    # a mapping of the same fields, beside ort-lazy's own names
    mixed = translate_options({"preferred_execution_providers": ["cpu"], "min_block_size": 3})
    assert Options(**mixed).providers == ("CPUExecutionProvider",) and mixed["min_block_size"] == 3
    assert translate_options(None) == {}
    assert set(LEGACY_OPTIONS) == {f.name for f in dataclasses.fields(OrtBackendOptions)}


@pytest.mark.parametrize(
    "given,words",
    [
        ({"use_aot_autograd": False}, ["use_aot_autograd=False", "AOTAutograd"]),
        ({"export_options": object()}, ["export_options", "no counterpart"]),
        ({"pre_ort_model_transforms": [print]}, ["pre_ort_model_transforms", "no counterpart"]),
        ({"preferred_execution_providers": [3]}, ["names or (name, options) pairs"]),
        ({"ort_session_options": {"threads": 1}}, ["onnxruntime.SessionOptions"]),
        ({"nonsense": 1}, ["unknown option", "preferred_execution_providers", "min_block_size"]),
        ({"providers": "cpu", "default_execution_providers": ["cpu"]}, ["either"]),
        ("cpu", ["OrtBackendOptions or a mapping"]),
    ],
)
def test_legacy_options_without_counterpart_are_refused(given: Any, words: list[str]) -> None:
    with pytest.raises(OptionsError) as e:
        translate_options(given)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_refused_option_through_torch_compile_is_clear() -> None:
    f = torch.compile(lambda x: x + 1, backend="onnxrt", options={"use_aot_autograd": False})
    with pytest.raises(Exception, match="use_aot_autograd"):
        f(torch.ones(1))

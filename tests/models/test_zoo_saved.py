"""The zoo's inference models saved with ``ort_lazy.save`` and loaded in a fresh process.

Per model: saved with dynamic dims (batch, and sequence for text), loaded in a process that
imports only torch and ort-lazy, called at two input sizes: outputs within the zoo's bound of
eager's (``rtol`` 1e-4, ``atol`` 1e-5 of the largest |value|), ORT ran, nothing of dynamo or the
exporter imported, load and first call within :data:`saved_runs.LOAD_BUDGET_S`. Whisper is
its encoder (the decoder's generation loop is not one inference graph). BERT runs by default;
the rest with the full tier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import zoo
from torch.export import Dim

import ort_lazy
from saved_runs import check_in_fresh_process, eager_calls

#: (batch, sequence length) of the two calls
SIZES = ((2, 12), (3, 7))
IMAGE_MODELS = ("resnet", "vit")


def _model(name: str) -> torch.nn.Module:
    model = zoo.CASES[name].model().eval()
    if name == "whisper":
        return model.model.encoder
    if hasattr(model, "config") and hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # a cache object is no output of a saved model
    return model


def _inputs(name: str, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    case = zoo.CASES[name]
    if name == "whisper":
        # the encoder takes exactly 2 * max_source_positions frames
        return {"input_features": torch.randn(batch, 16, 32, generator=gen)}
    if name in IMAGE_MODELS:
        key = "x" if case.family == "timm" else "pixel_values"
        return {key: torch.randn(batch, 3, 32, 32, generator=gen)}
    ids = torch.randint(1, zoo.VOCAB, (batch, length), generator=gen)
    if name != "bert":
        return {"input_ids": ids}
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length - 3 :] = 0  # the last row right-padded
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def _dynamic(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    batch = Dim("batch", min=1, max=64)
    if name in IMAGE_MODELS or name == "whisper":
        return {k: {0: batch} for k in inputs}
    seq = Dim("seq", min=2, max=32)
    return {k: {0: batch, 1: seq} for k in inputs}


@pytest.mark.parametrize(
    "name", ["bert", *(pytest.param(n, marks=pytest.mark.full) for n in ("gpt2", "llama", "resnet", "vit", "whisper"))]
)
def test_saved_zoo_model_in_a_fresh_process(name: str, tmp_path: Path) -> None:
    model = _model(name)
    example = _inputs(name, *SIZES[0], seed=0)
    path = tmp_path / f"{name}.ortl"
    info = ort_lazy.save(model, example, path, dynamic_shapes=_dynamic(name, example))
    assert info["ops_in_pytorch"] == [], info["ops_in_pytorch"]
    calls = eager_calls(model, [((), _inputs(name, batch, length, seed=i + 1)) for i, (batch, length) in enumerate(SIZES)])
    check_in_fresh_process(path, calls, tmp_path, direct=True)

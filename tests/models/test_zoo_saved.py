"""The zoo's inference models saved with ``ort_lazy.save`` and loaded in a fresh process.

Per model: saved with dynamic dims (batch, and sequence for text), loaded in a process that
imports only torch and ort-lazy, called at two input sizes: outputs within the zoo's bound of
eager's (``rtol`` 1e-4, ``atol`` 1e-5 of the largest |value|), ORT ran, nothing of dynamo or the
exporter imported, load and first call within :data:`saved_runs.LOAD_BUDGET_S`. Whisper is
its encoder (the decoder's generation loop is not one inference graph). BERT runs by default;
the rest with the full tier. BERT also goes to one ONNX file (``ort_lazy.export_onnx``), run
by onnxruntime in a process without torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zoo
from torch.export import Dim

import ort_lazy
from saved_runs import check_in_fresh_process, eager_calls, env

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


ONNX_CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
data = np.load(sys.argv[2])
errors = []
for i in range(2):
    feeds = {name: data[f"{name}{i}"] for name in ("input_ids", "attention_mask")}
    out, expected = sess.run(None, feeds)[0], data[f"logits{i}"]
    errors.append(float(np.abs(out - expected).max() / np.abs(expected).max()))
print("RESULT " + json.dumps({"errors": errors, "torch": "torch" in sys.modules,
      "inputs": [(i.name, i.shape) for i in sess.get_inputs()]}))
"""


def test_bert_as_one_onnx_file(tmp_path: Path) -> None:
    """BERT's sizes (the sequence length its masks and positions read) become Shape nodes of
    the file's inputs: it takes the two tensors only, named, with named dynamic dims."""
    model = _model("bert")
    example = _inputs("bert", *SIZES[0], seed=0)
    path = tmp_path / "bert.onnx"
    result = ort_lazy.export_onnx(model, example, path, dynamic_shapes=_dynamic("bert", example))
    assert result["inputs"] == ["input_ids", "attention_mask"] and result["outputs"] == ["logits"], result
    arrays = {}
    with torch.no_grad():
        for i, (batch, length) in enumerate(SIZES):
            inputs = _inputs("bert", batch, length, seed=i + 1)
            arrays.update({f"{k}{i}": v.numpy() for k, v in inputs.items()})
            arrays[f"logits{i}"] = model(**inputs).logits.numpy()
    np.savez(tmp_path / "data.npz", **arrays)
    proc = subprocess.run(
        [sys.executable, "-c", ONNX_CHILD, str(path), str(tmp_path / "data.npz")], capture_output=True, text=True, timeout=300, env=env()
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    report = json.loads(line[len("RESULT ") :])
    assert not report["torch"]
    assert report["inputs"] == [["input_ids", ["batch", "seq"]], ["attention_mask", ["batch", "seq"]]]
    assert max(report["errors"]) < 1e-4, report

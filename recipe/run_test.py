"""Test of the installed ort-lazy conda package: imports, bridge, parity, execution provider.

Usage: ``python run_test.py`` (CPU variant) or ``python run_test.py --cuda`` (CUDA variant).
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

import onnxruntime
import torch

import ort_lazy
from ort_lazy import metrics


class RecordingSession(onnxruntime.InferenceSession):
    """InferenceSession that remembers every instance, to see which providers ran."""

    created: list[onnxruntime.InferenceSession] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingSession.created.append(self)


def check_bridge() -> None:
    record = json.loads(resources.files("ort_lazy").joinpath("_bridge_build.json").read_text())
    assert record["torch_version"] == torch.__version__, (record["torch_version"], torch.__version__)
    from ort_lazy import _bridge

    assert _bridge.group_symbol(), "bridge loaded without its group symbol"
    print(f"bridge: built for torch {record['torch_version']}, loaded")


def check_parity(device: str) -> list[str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    x = torch.randn(8, 16, device=device)
    expected = model(x)
    onnxruntime.InferenceSession = RecordingSession
    metrics.reset()
    compiled = torch.compile(model, backend="ort")
    got = compiled(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    counters = metrics.counters()
    assert counters["ort_runs"] > 0, f"nothing ran on ONNX Runtime: {counters}"
    providers = [p for s in RecordingSession.created for p in s.get_providers()]
    print(f"parity on {device}: ok, {counters['ort_runs']} ORT run(s), providers {sorted(set(providers))}")
    return providers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cuda", action="store_true", help="the CUDA variant: check the CUDA execution provider")
    args = p.parse_args()
    print(
        f"ort-lazy {ort_lazy.__version__}, torch {torch.__version__}, onnxruntime {onnxruntime.__version__}"
    )
    check_bridge()
    if not args.cuda:
        assert torch.version.cuda is None, f"CPU variant with a CUDA pytorch ({torch.version.cuda})"
        check_parity("cpu")
        return
    assert torch.version.cuda, "CUDA variant with a CPU-only pytorch"
    available = onnxruntime.get_available_providers()
    assert "CUDAExecutionProvider" in available, f"onnxruntime without the CUDA EP: {available}"
    if not torch.cuda.is_available():
        print("no GPU visible: CUDA EP present in onnxruntime; device parity needs a GPU")
        check_parity("cpu")
        return
    providers = check_parity("cuda")
    assert "CUDAExecutionProvider" in providers, f"CUDA inputs did not run on the CUDA EP: {providers}"


if __name__ == "__main__":
    main()

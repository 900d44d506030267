"""The models ``save_load.py`` measures: (model, example inputs, dynamic shapes) by name.

``mlp`` is ort-lazy's 3 x 256 MLP at batch 32; ``mixed`` keeps a cumulative sum in PyTorch
between two ORT regions (saved with ``torch_executed_ops``: see :func:`make`); the others are
the test zoo's inference models (``tests/models/zoo.py``, Whisper's encoder).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import Dim

from ort_lazy.models import MLP


class Mixed(torch.nn.Module):
    """Linear, ReLU, a cumulative sum (kept in PyTorch), linear, softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(256, 256)
        self.b = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.cumsum(torch.relu(self.a(x)), dim=1)).softmax(-1)


def make(name: str) -> tuple[torch.nn.Module, Any, Any]:
    """(model in eval mode, example inputs, dynamic shapes) of ``name``."""
    torch.manual_seed(0)
    batch = Dim("batch", min=1, max=64)
    if name == "mlp":
        return MLP().eval(), (torch.randn(32, 256),), ({0: batch},)
    if name == "mixed":
        # torch_executed_ops reaches save through the environment, as it does torch.compile
        import os

        os.environ["ORT_LAZY_TORCH_EXECUTED_OPS"] = "aten.cumsum"
        return Mixed().eval(), (torch.randn(32, 256),), ({0: batch},)
    import test_zoo_saved as zoo_saved

    model = zoo_saved._model(name)
    inputs = zoo_saved._inputs(name, 2, 12, seed=0)
    return model, inputs, zoo_saved._dynamic(name, inputs)

"""The LORT MNIST test body, run in a process of its own by ``test_peer_lort.py``; prints JSON.

A LazyTensor crash in the bridge or in TorchScript's fuser may take the process down, so the
test asserts on what this prints (the last line): ``ok``, or the repetition that failed and why.
"""

from __future__ import annotations

import copy
import json
import traceback

import torch
import torch.nn.functional as F
from torch import nn


class MNISTModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1, bias=False)
        self.conv2 = nn.Conv2d(32, 64, 3, 1, bias=False)
        self.fc1 = nn.Linear(9216, 128, bias=False)
        self.fc2 = nn.Linear(128, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def run(model: nn.Module, device: str, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for param in model.parameters():
        param.grad = None
    model.to(device)
    output = model(x.to(device))
    loss = F.nll_loss(output, y.to(device))
    loss.backward()
    return loss, [param.grad for param in model.parameters()]


def run_mnist_model() -> None:
    x = torch.rand((64, 1, 28, 28), dtype=torch.float32)
    y = torch.randint(0, 9, (64,), dtype=torch.int64)
    model = MNISTModel()
    lazy_model = copy.deepcopy(model)
    # Baseline.
    loss, grads = run(model, "cpu", x, y)
    # ORT result.
    loss_new, grads_new = run(lazy_model, "lazy", x, y)
    torch.testing.assert_close(loss, loss_new.cpu(), rtol=1e-2, atol=1e-5)
    assert len(grads) == len(grads_new) == 4
    for g, g_new in zip(grads, grads_new):
        torch.testing.assert_close(g, g_new.cpu())


def main() -> None:
    import ort_lazy
    from ort_lazy import metrics

    torch.manual_seed(42)
    ort_lazy.lazy.init()
    result: dict = {"ok": True, "error": None, "repetition": None}
    for repetition in range(1, 6):
        try:
            run_mnist_model()
        except Exception as e:
            result = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}".splitlines()[0][:500],
                "repetition": repetition,
                "traceback": traceback.format_exc()[-2000:],
            }
            break
    result["counters"] = metrics.counters()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

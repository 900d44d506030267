"""SGD steps of one model on CPU and on ``device="lazy"`` (ORT through the bridge); prints JSON.

Run as ``python lazy_worker.py MODEL STEPS`` by ``test_zoo_lazy_jit.py``: a LazyTensor crash in
the bridge or TorchScript's fuser can take the process down, so each model trains in its own
process and the test asserts on what this prints (the last line). A step that raises is
reported with its number and message, the steps before it are kept.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Norm(nn.Module):
    """LayerNorm written with single-output ops (``native_layer_norm`` returns three tensors)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


class Block(nn.Module):
    """A pre-norm transformer block of single-output ops (3-d bmm attention, :class:`Norm`)."""

    def __init__(self, dim: int = 32, heads: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1, self.norm2 = Norm(dim), Norm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = d // self.heads
        # 3-d bmm: LazyTensor's 4-d matmul of permuted views comes back as a CPU tensor (torch)
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h).permute(2, 0, 3, 1, 4).reshape(3, b * self.heads, t, h)
        att = torch.softmax(torch.bmm(qkv[0], qkv[1].transpose(1, 2)) * h**-0.5, dim=-1)
        y = torch.bmm(att, qkv[2]).view(b, self.heads, t, h).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


class TokenClassifier(nn.Module):
    """A transformer body and a linear head; cross-entropy over every token."""

    def __init__(self, body: nn.Module, dim: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _cnn(pool: type[nn.Module]) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), pool(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


MODELS: dict[str, Callable[[], nn.Module]] = {
    "cnn_maxpool": lambda: _cnn(nn.MaxPool2d),
    "cnn_avgpool": lambda: _cnn(nn.AvgPool2d),
    "transformer": lambda: TokenClassifier(
        nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=0.0, batch_first=True)
    ),
    "transformer_block": lambda: TokenClassifier(Block()),
}


def _batch(name: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if name.startswith("cnn"):
        return torch.randn(4, 3, 16, 16, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    return torch.randn(2, 6, 32, generator=gen), torch.randint(0, 5, (2, 6), generator=gen)


def train(name: str, device: str, steps: int, sync: Callable[[], None]) -> dict:
    from ort_lazy import metrics

    torch.manual_seed(0)
    model = MODELS[name]().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    out: dict = {"losses": [], "ort_runs": [], "error": None, "error_step": None}
    for step in range(1, steps + 1):
        x, y = _batch(name, gen)
        try:
            opt.zero_grad()
            logits = model(x.to(device))
            loss = F.cross_entropy(logits.flatten(0, -2), y.to(device).flatten())
            loss.backward()
            opt.step()
            sync()
            out["losses"].append(loss.item())
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
            out["error_step"] = step
            out["traceback"] = traceback.format_exc()[-2000:]
            return out
        out["ort_runs"].append(metrics.counters()["ort_runs"])
    out["params"] = [p.detach().cpu().tolist() for p in model.parameters()]
    return out


def main() -> None:
    name, steps = sys.argv[1], int(sys.argv[2])
    import torch._lazy

    import ort_lazy
    from ort_lazy import metrics

    eager = train(name, "cpu", steps, lambda: None)
    ort_lazy.lazy.init()
    metrics.reset()
    lazy = train(name, "lazy", steps, torch._lazy.mark_step)
    result = {
        "eager": eager,
        "lazy": lazy,
        "counters": metrics.counters(),
        "fallbacks": metrics.fallbacks(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

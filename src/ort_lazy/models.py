"""Built-in models used by the demo, the benchmarks, explain and the tests (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["SeedModel", "MLP", "SmallCNN", "TinyGPT", "BuiltinModel", "BUILTIN", "get"]


class SeedModel(nn.Module):
    """``y = x*x; z = y+x; p = z*x; q = p-x; r = q/x``: five elementwise ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * x
        z = y + x
        p = z * x
        q = p - x
        return q / x


class MLP(nn.Module):
    """3 x (Linear + ReLU), width 256 by default."""

    def __init__(self, width: int = 256, depth: int = 3, out: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """conv + batch norm + ReLU + pooling, twice, then a linear head (3x64x64 input)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder: token + position embedding, causal attention blocks, LM head."""

    def __init__(self, vocab: int = 1000, dim: int = 128, heads: int = 4, layers: int = 2, max_len: int = 128) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


@dataclass(frozen=True)
class BuiltinModel:
    """A named model factory with a matching example-input factory."""

    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    description: str


def _seed_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.tensor([-1.0, 1.0, 2.0, 3.0]),)


BUILTIN: dict[str, BuiltinModel] = {
    "seed": BuiltinModel("seed", SeedModel, _seed_inputs, "5 elementwise ops (x*x+x)*x-x)/x"),
    "mlp": BuiltinModel("mlp", MLP, lambda: (torch.randn(32, 256),), "3 x Linear(256)+ReLU, batch 32"),
    "transformer": BuiltinModel(
        "transformer",
        lambda: nn.TransformerEncoderLayer(256, 4, batch_first=True, dropout=0.0),
        lambda: (torch.randn(8, 128, 256),),
        "nn.TransformerEncoderLayer d=256, 4 heads, batch 8, seq 128",
    ),
    "cnn": BuiltinModel("cnn", SmallCNN, lambda: (torch.randn(16, 3, 64, 64),), "conv/bn/pool CNN, batch 16 of 3x64x64"),
    "gpt": BuiltinModel(
        "gpt", TinyGPT, lambda: (torch.randint(0, 1000, (4, 64)),), "2-block causal decoder, vocab 1000, batch 4, seq 64"
    ),
}


def get(name: str) -> BuiltinModel:
    """The built-in model called ``name`` (see :data:`BUILTIN`)."""
    try:
        return BUILTIN[name]
    except KeyError:
        raise KeyError(f"unknown built-in model {name!r}; choose from {', '.join(BUILTIN)}") from None

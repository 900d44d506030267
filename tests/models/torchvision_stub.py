"""A CPU stand-in for the few ``torchvision`` names timm imports, for test environments without it.

The PyPI torchvision wheel is built against CUDA torch and cannot be loaded beside the pinned CPU
torch of this repository's environment, yet ``import timm`` imports ``torchvision`` at module
level. :func:`import_timm` registers a minimal ``torchvision`` package in ``sys.modules`` holding
exactly the names timm 1.0 imports, only while timm imports, and only when the real ``import
torchvision`` fails:

- ``torchvision.ops.misc.FrozenBatchNorm2d``: a faithful copy (timm's norm-layer factories and
  ``freeze_batch_norm_2d`` reference it; none of the zoo's models instantiate it);
- ``torchvision.transforms.functional.InterpolationMode``: the same enum (timm builds lookup
  tables from it at import time);
- the data-pipeline names (datasets, transforms): placeholders that raise when used. The model
  tests build networks only, never a dataset or an image transform.

``torchvision.models.feature_extraction`` is left out on purpose: timm imports it inside
``try/except ImportError`` and then simply disables FX feature extraction.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

import torch

_DATASETS = ("CIFAR100", "CIFAR10", "MNIST", "KMNIST", "FashionMNIST", "ImageFolder")
_TRANSFORMS = (
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "Grayscale",
    "Lambda",
    "Normalize",
    "PILToTensor",
    "RandomApply",
    "RandomChoice",
    "RandomCrop",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "Resize",
    "ToPILImage",
    "ToTensor",
)


class FrozenBatchNorm2d(torch.nn.Module):
    """BatchNorm2d with fixed statistics and affine parameters (as ``torchvision.ops.misc``)."""

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.reshape(1, -1, 1, 1)
        b = self.bias.reshape(1, -1, 1, 1)
        rv = self.running_var.reshape(1, -1, 1, 1)
        rm = self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + self.eps).rsqrt()
        return x * scale + (b - rm * scale)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class InterpolationMode(enum.Enum):
    """Interpolation modes (as ``torchvision.transforms.functional``)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _placeholder(qualname: str) -> type:
    """A class that can be subclassed at import time but raises when instantiated."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{qualname} is a test stand-in: torchvision is not installed")

    name = qualname.rsplit(".", 1)[-1]
    return type(name, (), {"__init__": __init__, "__module__": qualname.rsplit(".", 1)[0]})


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name, "test stand-in for torchvision (see tests/models/torchvision_stub.py)")
    mod.__dict__.update(attrs)
    mod.__path__ = []  # a package: ``import torchvision.x.y`` resolves through sys.modules
    return mod


def _stub_modules() -> dict[str, types.ModuleType]:
    misc = _module("torchvision.ops.misc", FrozenBatchNorm2d=FrozenBatchNorm2d)
    ops = _module("torchvision.ops", misc=misc)
    functional = _module("torchvision.transforms.functional", InterpolationMode=InterpolationMode)
    transforms = _module(
        "torchvision.transforms",
        functional=functional,
        InterpolationMode=InterpolationMode,
        **{n: _placeholder(f"torchvision.transforms.{n}") for n in _TRANSFORMS},
    )
    datasets = _module("torchvision.datasets", **{n: _placeholder(f"torchvision.datasets.{n}") for n in _DATASETS})
    root = _module("torchvision", ops=ops, transforms=transforms, datasets=datasets)
    return {m.__name__: m for m in (root, ops, misc, transforms, functional, datasets)}


def import_timm() -> types.ModuleType:
    """``import timm``, with the stand-in registered only while timm imports when torchvision is missing.

    The stand-in is removed from ``sys.modules`` again afterwards (timm keeps the names it bound),
    so other libraries (transformers checks ``importlib.util.find_spec("torchvision")``) still
    see that torchvision is not installed.
    """
    if "timm" in sys.modules:
        return sys.modules["timm"]
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or the CUDA-linked wheel failing to load beside CPU torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    else:
        import timm

        return timm
    stub = _stub_modules()
    sys.modules.update(stub)
    try:
        import timm
    finally:
        for name in stub:
            sys.modules.pop(name, None)
    return timm

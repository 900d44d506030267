"""``F.interpolate`` over its modes and parameters, forward and backward, against eager.

The OpInfo suite runs each op's first samples only; antialiased resampling with
``align_corners=True`` (ORT places its samples elsewhere: 0.4-1.7 off, silently) or by a scale
that is not the ratio of the sizes (``scale_factor=0.75``, the translation used the ratio: 1.1
off) was beyond them. Every combination either runs on ORT with eager's values or stays in PyTorch with its
reason named. The default run takes every mode and option with two sizes (:data:`FAST_SIZES`);
the full tier (``--full-tier``) every size.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ort_lazy import metrics

#: (mode, input rank, antialias options, align_corners options)
MODES = [
    ("nearest", 4, [False], [None]),
    ("nearest-exact", 4, [False], [None]),
    ("linear", 3, [False], [False, True]),
    ("bilinear", 4, [False, True], [False, True]),
    ("bicubic", 4, [False, True], [False, True]),
    ("trilinear", 5, [False], [False, True]),
    ("area", 4, [False], [None]),
]

#: size arguments, per spatial rank
SIZES = {
    1: [dict(size=7), dict(size=23), dict(scale_factor=0.6), dict(scale_factor=2.5, recompute_scale_factor=True)],
    2: [
        dict(size=(7, 13)),
        dict(size=(20, 40)),
        dict(scale_factor=(0.8, 1.0)),
        dict(scale_factor=0.5),
        dict(scale_factor=1.7),
        dict(scale_factor=0.75),  # 7.5 rows: eager samples 1/0.75 apart, not 10/7
        dict(scale_factor=(0.66, 1.3)),
        dict(scale_factor=0.75, recompute_scale_factor=True),
    ],
    3: [dict(size=(3, 7, 5)), dict(scale_factor=2.0), dict(scale_factor=(0.5, 1.5, 1.0))],
}

SHAPES = {3: (2, 3, 11), 4: (2, 3, 10, 20), 5: (1, 2, 4, 6, 5)}

#: the sizes every mode and option takes in the default run (a size, and a scale that is not
#: the ratio of the sizes); the others are in the full tier
FAST_SIZES = {
    1: [dict(size=7), dict(scale_factor=2.5, recompute_scale_factor=True)],
    2: [dict(size=(7, 13)), dict(scale_factor=0.75)],
    3: [dict(size=(3, 7, 5)), dict(scale_factor=(0.5, 1.5, 1.0))],
}


def _cases() -> list[Any]:
    cases = []
    for mode, rank, antialiases, corners in MODES:
        for antialias, align, size in itertools.product(antialiases, corners, SIZES[rank - 2]):
            kwargs = dict(mode=mode, **size)
            if antialias:
                kwargs["antialias"] = True
            if align is not None:
                kwargs["align_corners"] = align
            name = "-".join([mode, *(f"{k}={v}" for k, v in kwargs.items() if k != "mode")]).replace(" ", "")
            marks = [] if size in FAST_SIZES[rank - 2] else [pytest.mark.full]
            cases.append(pytest.param(rank, kwargs, id=name, marks=marks))
    return cases


@pytest.mark.parametrize(("rank", "kwargs"), _cases())
def test_interpolate_as_eager_forward_and_backward(rank: int, kwargs: dict[str, Any]) -> None:
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(SHAPES[rank], generator=generator)

    def step(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x * 2, **kwargs).sin()

    x_eager, x_ort = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = step(x_eager)
    weights = torch.randn(want.shape, generator=generator)
    (want * weights).sum().backward()
    torch._dynamo.reset()
    metrics.reset()
    got = torch.compile(step, backend="ort")(x_ort)
    (got * weights).sum().backward()
    torch._dynamo.reset()
    assert metrics.counters()["ort_runs"] > 0
    # upsampling with antialias: 1e-5 from eager, both as close to float64 (rounding)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x_ort.grad, x_eager.grad, rtol=1e-4, atol=1e-4)
    kept = {op for op in metrics.fallbacks() if "upsample" in op or "interp" in op}
    if kwargs.get("antialias") and kwargs.get("align_corners"):
        assert any(op.startswith(("aten._upsample_bilinear2d_aa", "aten._upsample_bicubic2d_aa")) for op in kept), kept

"""Means over no elements and variances whose correction passes the count, on the dynamo path.

ORT's ``ReduceMean`` gives 0 over an empty set where PyTorch's mean is NaN, and the variance
translation divides by ``N - correction`` where PyTorch divides by ``max(0, N - correction)``:
an empty batch's loss came back 0 and ``var(correction=5)`` of two numbers negative, silently.
Each graph also computes something ORT runs, so a fallback of the whole graph cannot pass.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from ort_lazy import metrics

_LONG_ZEROS = lambda x: torch.zeros(x.shape[0], dtype=torch.long)  # noqa: E731

#: name: a reduction with mean semantics of x (shape (0, 5) here)
EMPTY_MEANS: dict[str, Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]] = {
    "mean": lambda x: x.mean(),
    "mean-dim": lambda x: x.mean(0),
    "mean-keepdim": lambda x: x.mean((0, 1), keepdim=True),
    "var": lambda x: x.var(),
    "std-dim": lambda x: x.std(0),
    "var-mean": lambda x: torch.var_mean(x, 0),
    "std-mean": lambda x: torch.std_mean(x),
    "mse-loss": lambda x: F.mse_loss(x, x * 2),
    "l1-loss": lambda x: F.l1_loss(x, x * 2),
    "smooth-l1-loss": lambda x: F.smooth_l1_loss(x, x * 2),
    "huber-loss": lambda x: F.huber_loss(x, x * 2),
    "soft-margin-loss": lambda x: F.soft_margin_loss(x, x.sign()),
    "binary-cross-entropy": lambda x: F.binary_cross_entropy(x.sigmoid(), x.sigmoid()),
    "binary-cross-entropy-with-logits": lambda x: F.binary_cross_entropy_with_logits(x, x.sigmoid()),
    "kl-div": lambda x: F.kl_div(x, x.exp()),
    "cross-entropy": lambda x: F.cross_entropy(x, _LONG_ZEROS(x)),
    "nll-loss": lambda x: F.nll_loss(x, _LONG_ZEROS(x)),
    "poisson-nll-loss": lambda x: F.poisson_nll_loss(x, x.abs()),
    "gaussian-nll-loss": lambda x: F.gaussian_nll_loss(x, x, x.abs() + 1),
    "cosine-embedding-loss": lambda x: F.cosine_embedding_loss(x, x, torch.ones(x.shape[0])),
    "multilabel-soft-margin-loss": lambda x: F.multilabel_soft_margin_loss(x, x.sign().clamp(min=0)),
    "triplet-margin-loss": lambda x: F.triplet_margin_loss(x, x, x),
    "nanmean": lambda x: x.nanmean(),
}


def _flat(value: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _check(fn: Callable[..., object], *args: torch.Tensor, dynamic: bool | None = None) -> None:
    def with_work(*a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*_flat(fn(*a)), (a[-1].sin() + 1).sum(0))  # type: ignore[arg-type]

    torch._dynamo.reset()
    metrics.reset()
    got, want = torch.compile(with_work, backend="ort", dynamic=dynamic)(*args), with_work(*args)
    assert metrics.counters()["ort_runs"] > 0, metrics.counters()
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, equal_nan=True)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(EMPTY_MEANS))
def test_means_over_no_elements_are_nan(name: str, dtype: torch.dtype) -> None:
    """An empty batch through every reduction with mean semantics: NaN as eager's (not 0)."""
    _check(lambda x, y: EMPTY_MEANS[name](x), torch.empty(0, 5, dtype=dtype), torch.randn(3, 4, dtype=dtype))


@pytest.mark.parametrize("name", ["mean", "var", "var-mean", "std-mean", "mse-loss", "kl-div"])
def test_means_over_no_elements_with_dynamic_shapes(name: str) -> None:
    """With ``dynamic=True`` the other sizes are symbolic, and the element count of a (0, s0)
    batch is the symbolic ``0 * s0``: still known empty (``var_mean`` of one came back 0)."""
    _check(lambda x, y: EMPTY_MEANS[name](x), torch.empty(0, 5), torch.randn(3, 4), dynamic=True)


@pytest.mark.parametrize(
    ("name", "fn", "shape"),
    [
        ("var-past-the-count", lambda x: torch.var(x, correction=5), (2,)),
        ("var-dim-at-the-count", lambda x: torch.var(x, 1, correction=2), (3, 2)),
        ("std-past-the-count", lambda x: torch.std(x, 0, correction=3), (2, 3)),
        ("var-mean-past-the-count", lambda x: torch.var_mean(x, 0, correction=4), (3, 2)),
        ("var-of-one", lambda x: x.var(0), (1, 3)),
        ("negative-correction", lambda x: torch.var(x, 1, correction=-1), (3, 4)),
        ("fractional-correction", lambda x: torch.std(x, 1, correction=1.5), (3, 4)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_variances_with_a_correction_past_the_count(name: str, fn: Callable[..., object], shape: tuple[int, ...]) -> None:
    """PyTorch divides by ``max(0, N - correction)``: infinite (or NaN) past the count."""
    _check(lambda x, y: fn(x), torch.randn(shape, generator=torch.Generator().manual_seed(0)), torch.randn(3, 4))

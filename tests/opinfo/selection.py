"""Which OpInfo cases the suite runs, and which it compares leniently (no torch import:
``coverage.py`` reads these too)."""

from __future__ import annotations

__all__ = ["FAST", "FAST_BY_FLAVOUR", "RANDOM_OPS", "TIE_OPS", "fast_pairs"]

#: The fast subset (the default, run by ``build.py --test``): every op, one sample, these
#: (dtype, direction) pairs.
FAST = (("float32", "forward"), ("int64", "forward"), ("bool", "forward"), ("float32", "backward"))

#: The fast subset of flavours whose run of :data:`FAST` takes longer than CI's budget (the
#: OpenVINO provider compiles every region with OpenVINO: 1969 cases took 19 min on 2 busy
#: cores): every op, float32 forward. The rest of their cases run in the full tier
#: (``--opinfo full``).
FAST_BY_FLAVOUR: dict[str, tuple[tuple[str, str], ...]] = {"openvino": (("float32", "forward"),)}


def fast_pairs(flavour: str = "standard") -> tuple[tuple[str, str], ...]:
    """The (dtype, direction) pairs of the fast subset in ``flavour`` (see ``table.FLAVOURS``)."""
    return FAST_BY_FLAVOUR.get(flavour, FAST)

#: OpInfos whose result is random or reads uninitialised memory: eager itself gives a different
#: answer on every call, so there is nothing to compare. Not parametrized at all. (Ops that are
#: random only for some samples, e.g. attention with dropout, are caught at run time: eager
#: runs twice with different seeds and a sample whose result changes is skipped.)
RANDOM_OPS = frozenset(
    {
        # sampling from a distribution
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial",
        "normal", "normal/in_place", "normal/number_mean", "uniform",
        "rand_like", "randint", "randint_like", "randn", "randn_like",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout/with_train",
        "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        # random projections
        "svd_lowrank", "pca_lowrank",
        # uninitialised memory
        "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
        "new_empty_strided", "resize_", "resize_as_",
    }
)  # fmt: skip

#: Ops whose index outputs depend on the order of equal elements. Which of several equal
#: elements is reported is not defined (and ORT's TopK/ArgMax/... need not agree with PyTorch's
#: kernels), so their integer outputs are compared exactly only when the sample's input has no
#: repeated value (or ``stable=True`` asks for a defined order); values are always compared.
TIE_OPS = frozenset(
    {
        "sort", "argsort", "msort", "topk", "kthvalue", "mode", "median", "nanmedian",
        "max", "min", "cummax", "cummin", "masked.median",
        "nn.functional.max_pool1d", "nn.functional.max_pool2d", "nn.functional.max_pool3d",
        "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d",
        "nn.functional.adaptive_max_pool3d",
    }
)  # fmt: skip

"""Which OpInfo cases the suite runs, and which it compares leniently (no torch import:
``coverage.py`` reads these too)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

__all__ = ["FAST_BACKWARD", "FAST_BY_FLAVOUR", "FAST_FORWARD", "FAST_GROUPS", "RANDOM_OPS", "TIE_OPS", "fast_cases", "fast_groups", "group"]

#: The fast subset (the default, run by ``build.py --test``) takes one case of most ops, one
#: sample each. The ops fall into :data:`FAST_GROUPS` groups by a hash of their name
#: (:func:`group`: stable across machines, and an op added to PyTorch's database moves no other
#: op); the float32 forward case (AOTAutograd's inference graph) runs for the ops of the groups
#: in :data:`FAST_FORWARD`, the float32 backward case (the training graphs: forward outputs and
#: gradients) for those in :data:`FAST_BACKWARD` (their forward case where they have none).
#: That is half of the ops. Everything else (the remaining ops, the other dtypes and
#: directions, two samples per case) is the full tier: ``--opinfo=full``, which ``--full-tier``
#: (``build.py --test --full``, CI's full job) implies.
FAST_GROUPS = 6
FAST_FORWARD = (0, 1)
FAST_BACKWARD = (2,)


def group(op: str) -> int:
    """The group of the OpInfo ``op[/variant]`` (see :data:`FAST_GROUPS`)."""
    return zlib.crc32(op.encode()) % FAST_GROUPS


#: The fast subset of flavours whose run of the standard one takes longer than CI's budget
#: (OpenVINO's provider compiles every region with OpenVINO: 1969 cases of the older, larger
#: subset took 19 min on 2 busy cores, every op in float32 forward 4.5 min): (forward groups,
#: backward groups). OpenVINO's: a third of the ops in float32 forward (its provider runs
#: inference only; training graphs run on the CPU provider, which the standard flavour checks).
#: The rest of their cases run in the full tier (``--opinfo full``).
FAST_BY_FLAVOUR: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {"openvino": ((0, 1), ())}


def fast_groups(flavour: str = "standard") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (forward, backward) groups of ``flavour``'s fast subset (see ``table.FLAVOURS``)."""
    return FAST_BY_FLAVOUR.get(flavour, (FAST_FORWARD, FAST_BACKWARD))


def fast_cases(keys: Iterable[tuple[str, str, str]], flavour: str = "standard") -> set[tuple[str, str, str]]:
    """The (op, dtype, direction) cases of ``flavour``'s fast subset among ``keys`` (every case
    there is)."""
    keys = set(keys)
    forward, backward = fast_groups(flavour)
    fast = set()
    for op, dtype, direction in keys:
        if dtype != "float32":
            continue
        g = group(op)
        if direction == "backward" and g in backward:
            fast.add((op, dtype, direction))
        elif direction == "forward" and (g in forward or (g in backward and (op, dtype, "backward") not in keys)):
            fast.add((op, dtype, direction))
    return fast


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

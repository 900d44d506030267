"""Shape-level clean-up of a translated region with onnxscript's optimizer.

The aten graph a region is translated from spells out what PyTorch does with views: a linear
layer on a ``[B, T, C]`` tensor is ``view`` to ``[B*T, C]``, a matrix product, ``view`` back,
and attention reshapes that result again to split heads; shapes are ``Concat`` of constants;
``x.transpose(...)`` pairs cancel. ORT does not collapse chains of ``Reshape`` or remove the
reshapes around a matrix product, so every one costs a node dispatch per call (about 3 us each on
2 cores, most of a small model's run: the zoo's GPT-2 region had 42 ``Reshape`` after ORT's own
optimizations, T5's 121). :func:`clean_up` runs onnxscript's constant folding (on values computed
from constants only: a region's weights are never read) and a chosen set of its rewrite rules
that move no number: reshape chains, reshapes around a matrix product that broadcasting makes
redundant, transposes that cancel, no-op casts, expands and slices. After ORT's optimizations the
zoo's regions have 20-33% fewer nodes (GPT-2 96 -> 74, BERT 107 -> 79, T5 361 -> 241, Swin 112 ->
86); folded scale constants also let ORT fuse attention's scaled products into ``FusedMatMul``.

Left out on purpose, because they change numbers: ``Cast(Cast(x))`` merging (a float64 value
rounded through float32 to float16 is what eager computes), ``x + 0`` removal (``-0.0 + 0.0`` is
``+0.0``), ``Min``/``Max`` to ``Clip`` and ``Relu``/``Clip`` merging (NaN), and the fusions into
convolutions and ``Gemm`` (they fold weights).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .. import metrics

__all__ = ["RULE_NAMES", "clean_up"]

#: the onnxscript rewrite rules applied (``onnxscript.rewriter.rules.common`` names; one a
#: version lacks is skipped)
RULE_NAMES = (
    "reshape_reshape_rule",
    "two_reshapes_matmul_reshape_rule",
    "one_reshape_matmul_reshape_rule",
    "transpose_transpose_rule",
    "collapse_slice_rule",
    "collapse_slice2_rule",
)


def _rules() -> list[Any]:
    from onnxscript.rewriter.rules import common

    return [rule for rule in (getattr(common, name, None) for name in RULE_NAMES) if rule is not None]


def clean_up(model: Any) -> None:
    """Fold constants and apply :data:`RULE_NAMES` to the ``onnx_ir`` model ``model``, in place.

    Initializers whose data lives outside the model (weights shared with torch tensors) are
    hidden from both for the duration, as values unknown until the session: nothing reads or
    folds them.
    """
    import onnx_ir as ir
    from onnxscript.optimizer import fold_constants
    from onnxscript.rewriter import rewrite

    hidden = {}
    for value in model.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            hidden[value] = value.const_value
            value.const_value = None
    try:
        # the folder evaluates constants with numpy: log(0) or a cast of NaN warn, as they would
        # not in ORT's kernels that computed them before
        with metrics.timed("cleanup"), warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            fold_constants(model)
            rewrite(model, _rules())
    finally:
        for value, tensor in hidden.items():
            value.const_value = tensor

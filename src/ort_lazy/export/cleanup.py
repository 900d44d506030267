"""Shape-level clean-up of a translated region with onnxscript's optimizer.

The aten graph a region is translated from spells out what PyTorch does with views: a linear
layer on a ``[B, T, C]`` tensor is ``view`` to ``[B*T, C]``, a matrix product, ``view`` back,
and attention reshapes that result again to split heads; shapes are ``Concat`` of constants;
``x.transpose(...)`` pairs cancel. ORT does not collapse chains of ``Reshape`` or remove the
reshapes around a matrix product, so every one costs a node dispatch per call (about 3 us each on
2 cores, much of a small model's run: the test zoo's GPT-2 region had 42 ``Reshape`` after ORT's
own optimizations, T5's 121). :func:`clean_up` runs onnxscript's constant folding (on values
computed from constants only: a region's weights are never read) and the rewrite rules of
:data:`RULE_NAMES`, which move no number: reshape chains, reshapes around a matrix product that
broadcasting makes redundant, transposes that cancel, slices that take everything. After ORT's
optimizations the zoo's regions have 16-42% fewer nodes (GPT-2 96 -> 74, BERT 107 -> 81, T5 361
-> 241, LeViT 516 -> 376, SegFormer 270 -> 156, MobileViT 610 -> 511; convolutional networks
without such chains are unchanged); folded scale constants also let ORT fuse attention's scaled
products into ``FusedMatMul``. Cost: 2-15 ms per graph at compile time (none in a warm
process: the cleaned model is what the compile cache keeps).

Left out on purpose, because they change numbers: ``Cast(Cast(x))`` merging (a float64 value
rounded through float32 to float16 is what eager computes), ``x + 0`` removal (``-0.0 + 0.0`` is
``+0.0``), ``Min``/``Max`` to ``Clip`` and ``Relu``/``Clip`` merging (NaN), and the fusions into
convolutions and ``Gemm`` (they fold weights). Rules that never fired on the zoo were left out
too: each rule is tried at every node.
"""

from __future__ import annotations

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
    folds them. A fault in either is counted (``cleanup_failures``) and warned once; the model
    is then used as the passes left it (each rewrite replaces nodes by equal ones).
    """
    import onnx_ir as ir

    hidden = {}
    for value in model.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            hidden[value] = value.const_value
            value.const_value = None
    try:
        _run_passes(model)
    except Exception as e:  # never lose a region to its clean-up
        metrics.increment("cleanup_failures")
        text = f"{type(e).__name__}: {e}"[:300]
        metrics.warn_once(
            f"cleanup:{text}", "ort-lazy: the ONNX clean-up of %s failed, it runs as exported: %s", model.graph.name, text
        )
    finally:
        for value, tensor in hidden.items():
            value.const_value = tensor


def _run_passes(model: Any) -> None:
    from onnxscript.optimizer import fold_constants
    from onnxscript.rewriter import rewrite

    # the folder evaluates constants with numpy: log(0) or a cast of NaN would warn
    with metrics.timed("cleanup"), np.errstate(all="ignore"):
        fold_constants(model)
        rewrite(model, _rules())

"""Known ort-lazy bugs the zoo and peer tests hit, with their root cause.

A test that fails because of one of them keeps asserting the correct behaviour and is marked
with :func:`xfail` (strict): it turns into a failure (XPASS) as soon as the bug is fixed, and
then the marker goes. ``raises`` limits the expected failure to the exception the bug gives,
so a different failure is never hidden behind a known bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Bug:
    """One known bug: where it is, what goes wrong, and the exception a test sees."""

    name: str
    cause: str
    raises: type[BaseException] = AssertionError


TS_SOFTMAX = Bug(
    "ts_softmax",
    "frontends/jit.py _reason() answers from the FX/torchlib support table (support.op_reason), which "
    "accepts aten::_softmax, but the group is exported by export/torchscript.py with the TorchScript "
    "exporter, which has no symbolic for it: \"UnsupportedOperatorError: Exporting the operator "
    "'aten::_softmax' to ONNX opset version 18 is not supported\"; every LazyTensor softmax group is "
    "an export failure and runs in TorchScript",
)

TS_CONV = Bug(
    "ts_conv",
    "frontends/jit.py _reason() refuses aten::_convolution, aten::batch_norm and "
    "aten::adaptive_avg_pool2d as 'no ONNX mapping' because the torchlib registry it asks does not "
    "list them, yet the TorchScript exporter that exports the groups (export/torchscript.py) maps all "
    "three: a traced CNN's convolutions, batch norms and pooling never reach ORT",
)


def xfail(*bugs: Bug) -> Any:
    """A strict xfail marker for ``bugs`` (in the order a test meets them)."""
    reason = " | then: ".join(f"[{b.name}] {b.cause}" for b in bugs)
    raises = tuple(dict.fromkeys(b.raises for b in bugs))
    return pytest.mark.xfail(strict=True, reason=reason, raises=raises)

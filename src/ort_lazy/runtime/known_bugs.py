"""onnxruntime kernel bugs keyed by version and execution provider: :class:`KnownBug`, the table
of them (:data:`KNOWN_BUGS`) and :func:`has_bug`, whether a session meets one.

Bisected over onnxruntime 1.19-1.32 (CPU wheels, pure ONNX models) and, for OpenVINO's provider,
found on onnxruntime-openvino 1.24.1; each is checked by ``tests/test_ort_quirks.py`` on the
installed onnxruntime. :mod:`~ort_lazy.runtime.quirks` describes the other onnxruntime bugs and
what ort-lazy does about each; :mod:`~ort_lazy.runtime.kernel_fixes` rewrites models around the
bugs of this table it can.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

__all__ = [
    "KnownBug",
    "VersionRange",
    "KNOWN_BUGS",
    "INT64_REDUCTIONS_IN_DOUBLE_SINCE",
    "NOT_WHERE_FUSION_SINCE",
    "POOL_CEIL_EXTRA_WINDOW",
    "AVERAGE_POOL_PADDED_DIVISOR",
    "OPENVINO_REDUCE_MAX_LOWEST",
    "has_bug",
]

_CPU = "CPUExecutionProvider"
_OPENVINO = "OpenVINOExecutionProvider"

#: (first version with the bug, first version without it): None for "every version ort-lazy
#: takes" (1.19 on) and "no version tried so far"
VersionRange = tuple[tuple[int, int] | None, tuple[int, int] | None]


@dataclasses.dataclass(frozen=True)
class KnownBug:
    """An onnxruntime kernel bug and where it is: per execution provider, the versions that have it.

    Attributes:
        name: what goes wrong, in a few words.
        versions: provider -> (first version with the bug or None, first version without it or
            None); a provider not listed has no such bug.
    """

    name: str
    versions: Mapping[str, VersionRange]

    def applies(self, providers: Sequence[str], version: tuple[int, int]) -> bool:
        """Whether a session on ``providers`` (any of which may run a node) of onnxruntime
        ``version`` meets the bug."""
        for provider in providers:
            span = self.versions.get(provider)
            if span is None:
                continue
            first, fixed = span
            if (first is None or version >= first) and (fixed is None or version < fixed):
                return True
        return False


#: :data:`INT64_REDUCTIONS_IN_DOUBLE` by version (the integer lowerings are exact on every version)
INT64_REDUCTIONS_IN_DOUBLE_SINCE = KnownBug("int64 ReduceSum/ReduceProd computed in double", {_CPU: ((1, 27), None)})

#: :data:`NOT_WHERE_FUSION` by version (the optimizer is turned off on every version: it saves one Not)
NOT_WHERE_FUSION_SINCE = KnownBug("NotWhereFusion moves a -0.0 to Where's first branch", {_CPU: ((1, 25), None)})

#: ``MaxPool``/``AveragePool`` with ``ceil_mode=1`` keep a last window that starts past the input
#: and its leading padding, which ONNX and PyTorch drop: one output too many along that dim (9
#: rows, kernel 1, stride 3: 4 where PyTorch gives 3), every 1-3-D pooling with that geometry.
#: onnxruntime's CPU provider before 1.21.0 (1.19 and 1.20 checked), and OpenVINO's provider
#: (onnxruntime-openvino 1.24.1; no fixed version known). :func:`kernel_fixes` cuts the outputs to
#: ONNX's shape (a ``Slice``; the windows before it are right).
POOL_CEIL_EXTRA_WINDOW = KnownBug(
    "ceil-mode pooling keeps a window starting past the padded input", {_CPU: (None, (1, 21)), _OPENVINO: (None, None)}
)

#: ``AveragePool`` with ``count_include_pad=1`` divides by the wrong count: onnxruntime's CPU
#: provider before 1.21 divides a ceil-mode window that passes the padded input by the whole
#: kernel (PyTorch and ONNX: by its part inside the padded input); 1.21-1.24 get windows wrong
#: when the pads differ between spatial dims (kernel 6x6, stride 3, pads 2x3 on 9x9: 0.08 off;
#: ``avg_pool2d(ceil_mode=True, divisor_override=2)``, whose lowering pools with padding
#: counted: 3.7 and 7.3 off); OpenVINO's provider (onnxruntime-openvino 1.24.1) as before 1.21,
#: for padded inputs. Fixed in 1.25.0 (bisected with the CPU wheels of 1.19-1.32). ``count_include_pad=0``
#: is right on all of them: :func:`kernel_fixes` pools without the padding counted and multiplies
#: each window by (its elements inside the input) / (its elements inside the padded input), a
#: constant of the output's spatial shape.
AVERAGE_POOL_PADDED_DIVISOR = KnownBug(
    "AveragePool's count_include_pad divisor", {_CPU: (None, (1, 25)), _OPENVINO: (None, None)}
)

#: OpenVINO's float32 ``ReduceMax`` of elements that are all ``-inf`` gives the lowest finite float
#: (-3.4e38), not ``-inf`` (onnxruntime-openvino 1.24.1; float16 is right, float64 runs on the CPU
#: provider): ``aten._safe_softmax`` took such rows (every attention's masked rows) for unmasked
#: ones and gave NaN where eager gives 0. (Its ``ReduceMin`` of only ``+inf`` gives the largest
#: finite float likewise, so ``-ReduceMin(-x)`` is no way round.) :func:`kernel_fixes` puts
#: ``-inf`` where every reduced element is ``-inf``: a ``Where`` on a second ``ReduceMax``, of
#: the 0/1 mask of the elements that are not (exact, NaN kept).
OPENVINO_REDUCE_MAX_LOWEST = KnownBug("float32 ReduceMax of only -inf gives -3.4e38", {_OPENVINO: (None, None)})

#: the bugs :func:`kernel_fixes` rewrites models around
_FIXED_BY_REWRITE = (POOL_CEIL_EXTRA_WINDOW, AVERAGE_POOL_PADDED_DIVISOR, OPENVINO_REDUCE_MAX_LOWEST)


KNOWN_BUGS: tuple[KnownBug, ...] = (INT64_REDUCTIONS_IN_DOUBLE_SINCE, NOT_WHERE_FUSION_SINCE, *_FIXED_BY_REWRITE)


def has_bug(bug: KnownBug, providers: Sequence[str] = (_CPU,), version: tuple[int, int] | None = None) -> bool:
    """Whether a session on ``providers`` of onnxruntime ``version`` (default: the installed one)
    meets ``bug``."""
    if version is None:
        from .flavour import ort_version

        version = ort_version()
    return bug.applies(providers, version)

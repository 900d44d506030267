"""Rewrites into ops ORT runs well: the one table of ort-lazy's own decompositions.

:data:`DECOMPOSITIONS` replaces ops whose ONNX translation is missing, wrong or slow in ORT by
equivalents made of cheap ops (concatenations and slices instead of scatters, patterns ORT
fuses): exact, except GELU, which ORT's fused kernel computes to within rounding. Each topic
keeps its decompositions in its own module, with its own table:

* elementwise math: :mod:`.arithmetic` (division, remainders, powers, Python numbers on the
  left), :mod:`.signs`, :mod:`.trigonometry`, :mod:`.comparisons` (clamps, ``fmax``, ``isinf``),
  :mod:`.exponentials` (``log1p``, ``expm1``, ``logaddexp``);
* :mod:`.reductions`, :mod:`.products` (``addmm`` and kin, ``addcmul``, ``lerp``, ``fma``),
  :mod:`.activations` (and softmax), :mod:`.losses`, :mod:`.normalization`, :mod:`.pooling`,
  :mod:`.convolution` (its gradient), :mod:`.slices` (slice writes and splits),
  :mod:`.factories` (``arange``, random draws, ``copy``);
* ops without ONNX operators: :mod:`.scans`, :mod:`.indexing`, :mod:`.distances`,
  :mod:`.order`, :mod:`.padding`.

Graph passes that are not decompositions live with their topic:
:func:`.fast_paths.lower_fast_paths` (``nn.TransformerEncoderLayer``'s fused fast path) and
:func:`.pooling.drop_unused_indices`.
"""

from __future__ import annotations

from typing import Any

from .activations import ACTIVATION_DECOMPOSITIONS
from .arithmetic import ARITHMETIC_DECOMPOSITIONS
from .comparisons import COMPARISON_DECOMPOSITIONS
from .convolution import CONVOLUTION_DECOMPOSITIONS
from .distances import DISTANCE_DECOMPOSITIONS
from .exponentials import EXPONENTIAL_DECOMPOSITIONS
from .factories import FACTORY_DECOMPOSITIONS
from .indexing import INDEXING_DECOMPOSITIONS
from .losses import LOSS_DECOMPOSITIONS
from .normalization import NORMALIZATION_DECOMPOSITIONS
from .order import ORDER_DECOMPOSITIONS
from .padding import PADDING_DECOMPOSITIONS
from .pooling import POOLING_DECOMPOSITIONS
from .products import PRODUCT_DECOMPOSITIONS
from .reductions import REDUCTION_DECOMPOSITIONS
from .scans import SCAN_DECOMPOSITIONS
from .signs import SIGN_DECOMPOSITIONS
from .slices import SLICE_DECOMPOSITIONS
from .trigonometry import TRIGONOMETRY_DECOMPOSITIONS

__all__ = ["DECOMPOSITIONS"]


#: Extra decompositions added to the exporter's table (op -> implementation in ORT-friendly ops).
DECOMPOSITIONS: dict[Any, Any] = {
    **CONVOLUTION_DECOMPOSITIONS,
    **SLICE_DECOMPOSITIONS,
    **REDUCTION_DECOMPOSITIONS,
    **COMPARISON_DECOMPOSITIONS,
    **ARITHMETIC_DECOMPOSITIONS,
    **SIGN_DECOMPOSITIONS,
    **TRIGONOMETRY_DECOMPOSITIONS,
    **EXPONENTIAL_DECOMPOSITIONS,
    **NORMALIZATION_DECOMPOSITIONS,
    **ACTIVATION_DECOMPOSITIONS,
    **LOSS_DECOMPOSITIONS,
    **PRODUCT_DECOMPOSITIONS,
    **FACTORY_DECOMPOSITIONS,
    **POOLING_DECOMPOSITIONS,
    **SCAN_DECOMPOSITIONS,
    **INDEXING_DECOMPOSITIONS,
    **DISTANCE_DECOMPOSITIONS,
    **ORDER_DECOMPOSITIONS,
    **PADDING_DECOMPOSITIONS,
}

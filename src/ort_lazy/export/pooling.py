"""Max pooling with PyTorch's indices from one ONNX ``MaxPool``.

ONNX ``MaxPool`` numbers its indices over the whole tensor (``(n * C + c) * H * W + h * W + w``,
padding not counted); PyTorch numbers them within each plane (``h * W + w``). The exporter's
translation converts one to the other with a second, full-size ``MaxPool`` (kernel 1) whose
indices give each plane's offset; with ORT, a ``MaxPool`` that outputs indices takes its
generic kernel, so training-mode max pooling cost two slow passes over the input (ResNet-18's
stem pooling: 36 ms forward against eager's 7). Here the offset is removed by ``Mod`` with the
plane size: one pooling. Ties and windows are ONNX's, which are PyTorch's (the first maximum
of a window in row-major order; ceil mode and dilation as attributes); NaN is handled above
the translation (:func:`ort_lazy.lowering.rewrites._nan_pooling`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .emitter import translation_emitter

__all__ = ["TRANSLATIONS"]

_aten = torch.ops.aten


def _per_dim(value: int | Sequence[int], dims: int) -> list[int]:
    values = [int(value)] if isinstance(value, int) else [int(v) for v in value]
    return values * dims if len(values) == 1 else values


def _translation(dims: int) -> Callable[..., Any]:
    def translate(
        self: Any,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
    ) -> tuple[Any, Any]:
        import onnx_ir as ir

        e = translation_emitter(f"max_pool{dims}d_with_indices")
        if self.shape is None:
            raise ValueError("max pooling with indices needs the input's rank")
        kernel = _per_dim(kernel_size, dims)
        strides = _per_dim(stride, dims) if stride else kernel
        pads = _per_dim(padding, dims)
        unbatched = len(self.shape) == dims + 1
        x = e.op("Unsqueeze", self, e.op("Constant", value_ints=[0])) if unbatched else self
        values, flat = e.op(
            "MaxPool",
            x,
            num_outputs=2,
            kernel_shape=kernel,
            strides=strides,
            pads=pads + pads,
            dilations=_per_dim(dilation, dims),
            ceil_mode=int(bool(ceil_mode)),
        )
        spatial = e.op(
            "Slice", e.op("Shape", x), e.op("Constant", value_ints=[2]), e.op("Constant", value_ints=[2 + dims])
        )
        plane = e.op("ReduceProd", spatial, keepdims=0)
        indices = e.op("Mod", flat, plane)
        if unbatched:
            axes = e.op("Constant", value_ints=[0])
            values, indices = e.op("Squeeze", values, axes), e.op("Squeeze", indices, axes)
        values.dtype = self.dtype
        indices.dtype = ir.DataType.INT64
        return values, indices

    translate.__name__ = f"ort_lazy_max_pool{dims}d_with_indices"
    translate.__qualname__ = translate.__name__
    return translate


#: the translations, by aten overload
TRANSLATIONS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    _aten.max_pool2d_with_indices.default: _translation(2),
    _aten.max_pool3d_with_indices.default: _translation(3),
}

"""Why an op or region stays in PyTorch: stable reason strings and what a user can do."""

from __future__ import annotations

__all__ = ["Reason", "SUGGESTIONS", "suggestion"]


class Reason:
    """Why an op stays in PyTorch (stable strings shown by metrics and explain)."""

    NO_MAPPING = "no ONNX mapping for this op"
    DISTRUSTED = "its ONNX translation is known to be wrong"
    NO_KERNEL = "no ORT kernel for these dtypes on this provider"
    BAD_TRANSLATION = "the ONNX translation is ill-typed (ONNX type inference rejects it)"
    EXCLUDED = "excluded by the user (torch_executed_ops)"
    PREFERRED = "PyTorch's kernel is faster than ORT's form of this op (torch_preferred_ops)"
    COMPILE_FAILED = "compiling the graph failed"
    EXPORT_FAILED = "export failed"
    ORT_FAILED = "ORT session or run failed"
    UNSUPPORTED_DTYPE = "dtype not supported by ORT"
    UNSUPPORTED_DEVICE = "unsupported device (no ORT execution provider for it)"
    SYMBOLIC = "produces a Python scalar (symbolic shape arithmetic)"
    MUTATION = "mutates its input in place (kept in PyTorch)"
    SMALL_REGION = "region smaller than min_block_size"
    AUTOTUNE = "PyTorch was faster for this region (autotune)"
    UNFUSABLE = "TorchScript's fusion pass cannot group this node"
    EMPTY = "an empty tensor (nothing to compute)"
    RETURNED_VIEW = "a view of a graph input the graph returns, with symbolic sizes (made in PyTorch)"
    VIEW_OUTSIDE = "a shape view of a region's value, read after the region (made in PyTorch: no copy)"
    HIGHER_ORDER = "a higher-order op (runs in PyTorch and calls its graphs, listed as graphs of their own)"


#: a suggested fix per reason (matched as a prefix: reasons may carry details)
SUGGESTIONS = {
    Reason.NO_MAPPING: "no ONNX translation exists; it stays in PyTorch (a custom ONNX translation would move it)",
    Reason.DISTRUSTED: "nothing to do: ort-lazy keeps a translation it knows to be wrong off ORT",
    Reason.NO_KERNEL: "ORT has no kernel for this dtype on this provider: cast to float32/float16 around it, "
    "or choose a provider that has one",
    Reason.BAD_TRANSLATION: "the exporter's translation of this op is ill-typed for these dtypes; it stays in PyTorch",
    Reason.EXCLUDED: "remove it from torch_executed_ops / ORT_LAZY_TORCH_EXECUTED_OPS to run it on ORT",
    Reason.PREFERRED: "nothing to do; torch_preferred_ops=() / ORT_LAZY_TORCH_PREFERRED_OPS=none runs it on ORT too",
    Reason.COMPILE_FAILED: "set ORT_LAZY_STRICT=1 to see the exception; please report it",
    Reason.EXPORT_FAILED: "set ORT_LAZY_DUMP_DIR and ORT_LAZY_RUN_TYPE=debug to inspect the region",
    Reason.ORT_FAILED: "set ORT_LAZY_DUMP_DIR to get the ONNX model and try it in onnxruntime directly",
    Reason.UNSUPPORTED_DTYPE: "ONNX cannot carry this dtype; cast to a supported one",
    Reason.UNSUPPORTED_DEVICE: "move the tensors to a device ORT has an execution provider for (CPU, CUDA)",
    Reason.SMALL_REGION: "lower min_block_size / ORT_LAZY_MIN_BLOCK_SIZE",
    Reason.SYMBOLIC: "nothing to do: arithmetic on sizes is Python work, not tensor compute",
    Reason.MUTATION: "nothing to do: in-place updates of graph inputs (e.g. BatchNorm running stats) stay in PyTorch",
    Reason.AUTOTUNE: "nothing to do: PyTorch measured faster for this region",
    Reason.EMPTY: "nothing to do: an op on empty tensors has nothing for ORT to compute",
    Reason.RETURNED_VIEW: "nothing to do: a view costs nothing in PyTorch, and AOTAutograd rebuilds such an "
    "output from the view itself",
    Reason.VIEW_OUTSIDE: "nothing to do: the view costs nothing in PyTorch, and ORT would have copied the "
    "value whole (partition.VIEW_OUTSIDE_BYTES)",
    Reason.HIGHER_ORDER: "nothing to do: the graphs it calls run their regions on ORT where PyTorch calls them "
    "on plain tensors (cond, while_loop, map, scan, nested compile regions)",
    Reason.UNFUSABLE: "nothing to do on the TorchScript / LazyTensor front doors; torch.compile(backend='ort') "
    "runs such nodes on ORT",
}


def suggestion(reason: str) -> str:
    """A suggested fix for a fallback reason ('' when there is none)."""
    for key, text in SUGGESTIONS.items():
        if reason.startswith(key):
            return text
    return ""

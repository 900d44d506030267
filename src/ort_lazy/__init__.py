"""ort-lazy: ONNX Runtime as a backend for every PyTorch compiler.

Front doors:

* ``torch.compile(model, backend="ort")`` (no import needed) or :func:`compile`;
* ``ort_lazy.fx.compile(graph_module, example_inputs)``;
* ``ort_lazy.lazy.init()`` then tensors on ``device="lazy"`` (needs the built bridge);
* ``ort_lazy.jit.enable()`` for ``torch.jit.script`` / ``trace`` graphs (needs the bridge).
"""

from __future__ import annotations

from typing import Any

from . import metrics
from .options import Options, OptionsError

__version__ = "0.1.0"

__all__ = ["Options", "OptionsError", "compile", "metrics", "__version__"]


def compile(model: Any, *, dynamic: bool | None = None, fullgraph: bool = False, **options: Any) -> Any:
    """``torch.compile(model, backend="ort")`` with ort-lazy :class:`Options` as keywords."""
    from .frontends.dynamo import compile as _compile

    return _compile(model, dynamic=dynamic, fullgraph=fullgraph, **options)


def __getattr__(name: str) -> Any:
    # Submodules loaded on first use keep `import ort_lazy` cheap.
    if name in ("fx", "lazy", "jit", "explain"):
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        return getattr(module, name) if name == "explain" else module
    raise AttributeError(f"module 'ort_lazy' has no attribute {name!r}")

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
from ._version import __version__
from .options import Options, OptionsError

__all__ = ["Options", "OptionsError", "compile", "explain", "metrics", "__version__"]


def compile(model: Any, *, dynamic: bool | None = None, fullgraph: bool = False, **options: Any) -> Any:
    """``torch.compile(model, backend="ort")`` with ort-lazy :class:`Options` as keywords."""
    from .frontends.dynamo import compile as _compile

    return _compile(model, dynamic=dynamic, fullgraph=fullgraph, **options)


def explain(model: Any, *example_inputs: Any, backward: bool = False, **options: Any) -> Any:
    """Report partitions, the share of ops on ORT and every op left to PyTorch with its reason.

    Returns an :class:`ort_lazy.debug.records.ExplainReport` (``print`` it, or ``.as_dict()``).
    """
    from .frontends.explain import explain as _explain

    return _explain(model, *example_inputs, backward=backward, **options)


def __getattr__(name: str) -> Any:
    # Submodules loaded on first use keep `import ort_lazy` cheap.
    if name in ("fx", "lazy", "jit"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ort_lazy' has no attribute {name!r}")

"""ort-lazy: ONNX Runtime as a backend for every PyTorch compiler.

Front doors:

* ``torch.compile(model, backend="ort")`` (no import needed) or :func:`compile`;
* ``ort_lazy.fx.compile(graph_module, example_inputs)``;
* ``ort_lazy.lazy.init()`` then tensors on ``device="lazy"`` (needs the built bridge);
* ``ort_lazy.jit.enable()`` for ``torch.jit.script`` / ``trace`` graphs (needs the bridge).

Keeping what was compiled: :func:`save` writes a model as ort-lazy runs it to one artifact,
:func:`load` runs it in another process (no dynamo, no export, no model code), and
:func:`export_onnx` writes a model that runs wholly on ORT as one ONNX file.
"""

from __future__ import annotations

from typing import Any

from . import metrics
from ._version import __version__
from .options import Options, OptionsError

__all__ = [
    "ArtifactError",
    "Options",
    "OptionsError",
    "SaveError",
    "compile",
    "explain",
    "export_onnx",
    "load",
    "metrics",
    "save",
    "__version__",
]


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


def save(
    model: Any, example_inputs: Any, path: Any, *, dynamic_shapes: Any = None, verify: bool = True, program: bool = False,
    **options: Any,
) -> Any:
    """Save ``model`` as ort-lazy runs it to one artifact at ``path`` (its ORT regions' ONNX
    models, the PyTorch code between them, the weights, a manifest). See
    :func:`ort_lazy.frontends.save.save`; :func:`load` runs it."""
    from .frontends.save import save as _save

    return _save(model, example_inputs, path, dynamic_shapes=dynamic_shapes, verify=verify, program=program, **options)


def load(
    path: Any, *, providers: Any = None, session_options: Any = None, provider_options: Any = None, **options: Any
) -> Any:
    """Load an artifact :func:`save` wrote; returns a callable
    :class:`~ort_lazy.runtime.artifact.LoadedModel`. ``providers``, ``session_options``,
    ``provider_options`` (and the other ORT options: ``ep_libraries``, ``allow_spinning`` ...)
    are chosen here. Every member is hash-verified before anything is read; nothing is
    unpickled (the program of ``save(..., program=True)`` is read by ``torch.export.load`` only
    when ``.program`` is asked for).
    Raises :class:`ArtifactError` for a damaged, tampered or incompatible artifact."""
    from .frontends.settings import resolve_options
    from .runtime.artifact import load as _load

    given = {k: v for k, v in (("providers", providers), ("session_options", session_options), ("provider_options", provider_options)) if v is not None}
    return _load(path, resolve_options(None, **given, **options))


def export_onnx(model: Any, example_inputs: Any, path: Any, *, dynamic_shapes: Any = None, **options: Any) -> Any:
    """Write ``model`` as one ONNX file exactly as ort-lazy runs it, weights included, for a
    plain ``onnxruntime.InferenceSession``. See :func:`ort_lazy.frontends.save.export_onnx`."""
    from .frontends.save import export_onnx as _export_onnx

    return _export_onnx(model, example_inputs, path, dynamic_shapes=dynamic_shapes, **options)


def __getattr__(name: str) -> Any:
    # Submodules loaded on first use keep `import ort_lazy` cheap.
    if name in ("fx", "lazy", "jit"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name == "ArtifactError":
        from .runtime.artifact_format import ArtifactError

        return ArtifactError
    if name == "SaveError":
        from .frontends.save_capture import SaveError

        return SaveError
    raise AttributeError(f"module 'ort_lazy' has no attribute {name!r}")

"""The ``onnxrt`` name: a drop-in for PyTorch's removed ONNX Runtime backend.

PyTorch's ``torch.compile(model, backend="onnxrt")`` (``torch.onnx._internal.onnxruntime``,
removed after torch 2.5) took its options as an ``OrtBackendOptions`` dataclass or a mapping of
its fields. Scripts, configs and tools written for it still name it: accelerate's
``DynamoBackend.ONNXRT`` (``Accelerator(dynamo_backend="onnxrt")``, ``accelerate launch
--dynamo_backend onnxrt``) and so Hugging Face's ``TrainingArguments(torch_compile_backend=
"onnxrt")``. ort-lazy registers the name through the same entry point as ``ort``: the backend is
ort-lazy's, the old options are mapped where ort-lazy has a counterpart
(:data:`LEGACY_OPTIONS`), and the rest are refused with an :class:`~ort_lazy.options.OptionsError`
that says what to use instead. ort-lazy's own option names are accepted beside them, and its
``ORT_LAZY_*`` variables apply as with ``ort``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..lowering.aten import compile_captured
from ..options import Options, OptionsError
from .dynamo import mode_options
from .settings import resolve_options

__all__ = ["OrtBackendOptions", "LEGACY_OPTIONS", "translate_options", "onnxrt_backend"]


@dataclasses.dataclass(frozen=True)
class OrtBackendOptions:
    """The options of PyTorch's removed ``onnxrt`` backend, field for field.

    Attributes:
        preferred_execution_providers: providers to try first: names, or ``(name, options)``
            pairs (ort-lazy's ``providers`` and ``provider_options``).
        infer_execution_providers: add the providers the inputs' device calls for (CUDA for CUDA
            tensors, then CPU) after the preferred ones.
        default_execution_providers: providers after those (ORT's CPU provider when None).
        preallocate_output: outputs in torch tensors given to ORT before the run: ort-lazy binds
            torch-allocated outputs whenever their sizes are known, whatever the value.
        use_aot_autograd: must be True: ort-lazy lowers every graph through AOTAutograd.
        export_options: a ``torch.onnx.ExportOptions``: must be None (ort-lazy translates graphs
            with its own exporter settings).
        ort_session_options: an ``onnxruntime.SessionOptions``: its attributes that differ from
            a fresh one become ort-lazy's ``session_options``.
        pre_ort_model_transforms: must be None (ort-lazy rewrites its models itself).
    """

    preferred_execution_providers: Sequence[Any] | None = None
    infer_execution_providers: bool = True
    default_execution_providers: Sequence[Any] | None = None
    preallocate_output: bool = False
    use_aot_autograd: bool = True
    export_options: Any = None
    ort_session_options: Any = None
    pre_ort_model_transforms: Sequence[Callable[[Any], None]] | None = None


#: each field of :class:`OrtBackendOptions` and what ort-lazy does with it
LEGACY_OPTIONS: dict[str, str] = {
    "preferred_execution_providers": "providers (names) and provider_options (the options of (name, options) pairs)",
    "infer_execution_providers": "with preferred providers: the device's providers (CUDA for CUDA inputs, then CPU) follow them",
    "default_execution_providers": "providers, after the preferred ones",
    "preallocate_output": "always on where output sizes are known (accepted, no effect)",
    "use_aot_autograd": "always True (False is refused)",
    "export_options": "refused (ort-lazy translates graphs itself)",
    "ort_session_options": "session_options: the SessionOptions attributes that differ from a fresh one",
    "pre_ort_model_transforms": "refused (no counterpart)",
}

_FIELDS = {f.name for f in dataclasses.fields(OrtBackendOptions)}
_SESSION_ATTRIBUTES = (
    "intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
    "execution_order", "enable_profiling", "profile_file_prefix", "log_severity_level", "log_verbosity_level",
    "enable_mem_pattern", "enable_mem_reuse", "enable_cpu_mem_arena", "use_deterministic_compute",
    "optimized_model_filepath",
)


def _providers_of(entries: Sequence[Any] | None, what: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    names: list[str] = []
    options: dict[str, dict[str, Any]] = {}
    for entry in entries or ():
        if isinstance(entry, str):
            names.append(entry)
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], Mapping):
            names.append(entry[0])
            options[entry[0]] = dict(entry[1])
        else:
            raise OptionsError(f"{what}: expected provider names or (name, options) pairs, got {entry!r}")
    return names, options


def _session_options_of(so: Any) -> dict[str, Any]:
    """The attributes of an ``onnxruntime.SessionOptions`` that differ from a fresh one."""
    import onnxruntime

    if not isinstance(so, onnxruntime.SessionOptions):
        raise OptionsError(f"ort_session_options: expected an onnxruntime.SessionOptions, got {type(so).__name__}")
    fresh = onnxruntime.SessionOptions()
    out: dict[str, Any] = {}
    for name in _SESSION_ATTRIBUTES:
        value = getattr(so, name, None)
        if value != getattr(fresh, name, None):
            out[name] = getattr(value, "name", value)
    return out


def translate_options(options: Any) -> dict[str, Any]:
    """ort-lazy options for what the ``onnxrt`` backend is given: an :class:`OrtBackendOptions`
    (this one or anything with its fields, such as PyTorch's own dataclass) or a mapping of
    its field names and/or ort-lazy option names; None gives none.

    Raises:
        OptionsError: a field with no counterpart is set (the message says what to do), or a
            name is neither a field nor an ort-lazy option.
    """
    if options is None:
        return {}
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        given = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    elif isinstance(options, Mapping):
        given = dict(options)
    else:
        raise OptionsError(
            f"onnxrt options: expected an OrtBackendOptions or a mapping, got {type(options).__name__} {options!r:.80}"
        )
    ours = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(given) - _FIELDS - ours)
    if unknown:
        raise OptionsError(
            f"onnxrt options: unknown option(s) {unknown}; accepted: the OrtBackendOptions fields "
            f"({', '.join(sorted(_FIELDS))}) and ort-lazy's options ({', '.join(sorted(ours))})"
        )
    out = {k: v for k, v in given.items() if k in ours}
    legacy = {k: v for k, v in given.items() if k in _FIELDS}
    if legacy.get("use_aot_autograd", True) is not True:
        raise OptionsError("onnxrt options: use_aot_autograd=False has no counterpart: ort-lazy lowers every graph through AOTAutograd; drop it")
    for name in ("export_options", "pre_ort_model_transforms"):
        if legacy.get(name) is not None:
            raise OptionsError(
                f"onnxrt options: {name} has no counterpart in ort-lazy ({LEGACY_OPTIONS[name]}); drop it "
                "(ort_lazy.explain shows what ort-lazy exports, dump_dir writes its ONNX models)"
            )
    preferred, preferred_options = _providers_of(legacy.get("preferred_execution_providers"), "preferred_execution_providers")
    default, default_options = _providers_of(legacy.get("default_execution_providers"), "default_execution_providers")
    if preferred or default:
        if "providers" in out:
            raise OptionsError("onnxrt options: give providers either as ort-lazy's providers or as *_execution_providers")
        names = [*preferred]
        if legacy.get("infer_execution_providers", True) and not default:
            names.append("CPUExecutionProvider")
        names += default
        out["providers"] = tuple(dict.fromkeys(names))
        out["provider_options"] = {**default_options, **preferred_options, **dict(out.get("provider_options") or {})}
    if legacy.get("ort_session_options") is not None:
        out["session_options"] = {**_session_options_of(legacy["ort_session_options"]), **dict(out.get("session_options") or {})}
    return out


def onnxrt_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Any = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """The ``onnxrt`` dynamo backend: ``torch.compile(model, backend="onnxrt", options=...)``,
    ort-lazy with PyTorch's removed backend's options (:func:`translate_options`)."""
    given = options if isinstance(options, Options) else translate_options(options)
    return compile_captured(gm, example_inputs, resolve_options(given, **mode_options(mode)))


onnxrt_backend._ort_lazy_backend = True  # type: ignore[attr-defined]

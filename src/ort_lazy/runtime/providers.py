"""Execution providers: what each one reads, and how a session is given them.

ORT runs a model on a list of execution providers (EPs) in priority order; each takes the
nodes it can and leaves the rest to the next, the CPU provider last. They differ in what they
read. ORT's own kernel providers (CPU, CUDA, ROCm) run ORT's kernels: local functions, its
``com.microsoft`` contrib ops and ONNX's newest opsets are fine. The others (OpenVINO,
TensorRT, DirectML, CoreML, QNN, ...) hand the nodes to another compiler through its own ONNX
reader, which needs every value typed (element type and rank), reads no local functions, knows
only standard ops (DirectML also some contrib ops) and stops at some opset; a few
(NNAPI, QNN, CoreML, VitisAI, RKNPU) compile for fixed shapes only. :func:`region_form` turns a
provider list into the form a region's ONNX model is written in (:class:`RegionForm`), so each
provider gets a model its reader takes; the CPU provider's models are unchanged by it.

Plugin EPs (ORT 1.23 and later) come as shared libraries registered at run time
(``onnxruntime.register_execution_provider_library``) and are chosen by device
(``onnxruntime.get_ep_devices()``, ``SessionOptions.add_provider_for_devices``) or by ORT's
selection policy (``SessionOptions.set_provider_selection_policy``): :func:`register_libraries`,
:func:`select_devices` and :func:`apply_devices`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..options import DEVICE_TYPES, EP_POLICIES, Options, OptionsError
from .flavour import flavour, onnxruntime, ort_version

__all__ = [
    "ProviderTraits",
    "TRAITS",
    "traits_of",
    "RegionForm",
    "region_form",
    "CPU",
    "kernel_providers",
    "register_libraries",
    "library_path",
    "select_devices",
    "device_problem",
    "uses_device_api",
    "apply_devices",
    "ep_nodes",
]

CPU = "CPUExecutionProvider"


@dataclasses.dataclass(frozen=True)
class ProviderTraits:
    """What one execution provider reads.

    Attributes:
        ort_kernels: runs ORT's own kernels (the kernel registry answers what it takes; local
            functions and contrib ops are fine).
        contrib_ops: takes ORT's ``com.microsoft`` ops (``FastGelu``, ``FusedMatMul``).
        max_opset: newest default-domain opset its reader takes (None: ORT's own).
        static_shapes: compiles for fixed input shapes only.
        device_memory: reads and writes a GPU's memory (``cuda`` tensors); False: host memory.
        inference_only: its reader takes inference graphs only (training forms such as
            ``LayerNormalization``'s saved statistics or reducing scatters are refused):
            training graphs run on the kernel providers of the list instead.
    """

    ort_kernels: bool = False
    contrib_ops: bool = False
    max_opset: int | None = None
    static_shapes: bool = False
    device_memory: bool = False
    inference_only: bool = False


#: The providers ort-lazy knows, by ORT's name. Providers not listed are taken as the
#: strictest kind (standard ops, typed values, no functions) with dynamic shapes.
TRAITS: dict[str, ProviderTraits] = {
    "CPUExecutionProvider": ProviderTraits(ort_kernels=True, contrib_ops=True),
    "CUDAExecutionProvider": ProviderTraits(ort_kernels=True, contrib_ops=True, device_memory=True),
    "ROCMExecutionProvider": ProviderTraits(ort_kernels=True, contrib_ops=True, device_memory=True),
    # its parser (onnx-tensorrt) reads standard ops only: a com.microsoft op (FastGelu) would go
    # to the CUDA provider and cut TensorRT's engine in two, where the standard form stays in
    # it; ORT's CUDA provider after it runs whatever the parser refuses, so no opset bound (and
    # dynamic shapes, with profiles: runtime/tensorrt.py)
    "TensorrtExecutionProvider": ProviderTraits(device_memory=True),
    "MIGraphXExecutionProvider": ProviderTraits(device_memory=True),
    "DmlExecutionProvider": ProviderTraits(contrib_ops=True),
    # OpenVINO 2025's ONNX frontend: opsets up to 22 (ONNX's Attention, opset 23, is refused)
    "OpenVINOExecutionProvider": ProviderTraits(max_opset=22, inference_only=True),
    "DnnlExecutionProvider": ProviderTraits(),
    "XnnpackExecutionProvider": ProviderTraits(),
    "WebGpuExecutionProvider": ProviderTraits(),
    "CoreMLExecutionProvider": ProviderTraits(static_shapes=True, inference_only=True),
    "QNNExecutionProvider": ProviderTraits(static_shapes=True, inference_only=True),
    "NnapiExecutionProvider": ProviderTraits(static_shapes=True, inference_only=True),
    "VitisAIExecutionProvider": ProviderTraits(static_shapes=True, inference_only=True),
    "RknpuExecutionProvider": ProviderTraits(static_shapes=True, inference_only=True),
}

_UNKNOWN = ProviderTraits()


def traits_of(provider: str) -> ProviderTraits:
    """The :class:`ProviderTraits` of ``provider`` (the strictest for one ort-lazy does not know)."""
    return TRAITS.get(provider, _UNKNOWN)


@dataclasses.dataclass(frozen=True)
class RegionForm:
    """How a region's ONNX model is written for a list of providers.

    Attributes:
        own: every provider runs ORT's own kernels: the model is written as for the CPU
            provider alone (the other fields are then all permissive).
        contrib_ops: ``com.microsoft`` ops may be emitted (every provider takes them).
        inline_functions: local functions are inlined (some provider's reader has none).
        typed_values: every value of the graph gets its element type and shape in
            ``value_info`` (some provider's reader needs them).
        fused_attention: attention may be one ONNX ``Attention`` (opset 23; ORT's kernel
            providers: ``ort_lazy.export.attention.settle`` still checks the kernel).
        max_opset: the default domain's opset must not exceed this (None: no bound).
        static_shapes: some provider compiles for fixed shapes only: one model per input shape.
        host_outputs: the outputs are host memory, so check outputs (flags read after the run)
            cost nothing; False for GPU providers (reading a flag would wait for the GPU).
    """

    own: bool
    contrib_ops: bool
    inline_functions: bool
    typed_values: bool
    fused_attention: bool
    max_opset: int | None
    static_shapes: bool
    host_outputs: bool


@functools.lru_cache(maxsize=64)
def region_form(providers: tuple[str, ...] | None) -> RegionForm:
    """The :class:`RegionForm` for ``providers`` (None: the CPU provider alone).

    ORT gives each node to the first provider that takes it, so the model must suit every
    provider in the list: the form is the strictest of theirs. The CPU provider, last in most
    lists, only takes what the others leave.
    """
    names = tuple(providers or (CPU,))
    traits = [traits_of(p) for p in names]
    own = all(t.ort_kernels for t in traits)
    bounds = [t.max_opset for t in traits if t.max_opset is not None]
    return RegionForm(
        own=own,
        contrib_ops=all(t.contrib_ops for t in traits),
        inline_functions=not own,
        typed_values=not own,
        fused_attention=own,
        max_opset=min(bounds) if bounds else None,
        static_shapes=any(t.static_shapes for t in traits),
        host_outputs=not any(t.device_memory for t in traits),
    )


def kernel_providers(providers: Sequence[str]) -> list[str]:
    """The providers of ``providers`` that run ORT's own kernels (what ORT falls back to for
    the nodes the others refuse); ``providers`` itself when none does."""
    own = [p for p in providers if traits_of(p).ort_kernels]
    return own or list(providers)


# --------------------------------------------------------------------------- plugin EPs

_registered: dict[str, str] = {}
_lock = threading.Lock()


def library_path(source: str) -> str:
    """The shared library a plugin EP ``source`` names: a path to the library, or an importable
    package that ships one and says where (``get_library_path()``, as
    ``onnxruntime_ep_openvino`` does).

    Raises:
        OptionsError: neither a file nor an importable package with ``get_library_path``.
    """
    if os.path.sep in source or source.endswith((".so", ".dll", ".dylib")) or os.path.isfile(source):
        if not os.path.isfile(source):
            raise OptionsError(f"ep_libraries: no plugin EP library at {source!r}")
        return os.path.abspath(source)
    try:
        module = importlib.import_module(source)
    except ImportError as e:
        raise OptionsError(
            f"ep_libraries: {source!r} is neither a library file nor an importable package ({e}); "
            f"install the plugin package (e.g. `pip install {source.replace('_', '-')}`) or give the "
            "library's path"
        ) from None
    get = getattr(module, "get_library_path", None)
    if not callable(get):
        raise OptionsError(f"ep_libraries: package {source!r} has no get_library_path(); give the library's path")
    path = str(get())
    if not os.path.isfile(path):
        raise OptionsError(f"ep_libraries: package {source!r} names a library that is not there: {path}")
    return path


def _ep_name_of(source: str, name: str | None) -> str:
    """The registration name of a plugin library: given, or the package's ``get_ep_name()``."""
    if name:
        return name
    try:
        module = importlib.import_module(source)
    except ImportError:
        module = None
    get = getattr(module, "get_ep_name", None)
    if callable(get):
        return str(get())
    raise OptionsError(
        f"ep_libraries: name the EP {source!r} provides, e.g. ep_libraries={{'MyExecutionProvider': {source!r}}}"
    )


def register_libraries(libraries: Mapping[str, str]) -> dict[str, str]:
    """Register the plugin EP libraries ``libraries`` (registration name -> library path or
    package; an empty name takes the package's ``get_ep_name()``) with ORT, once per process.
    Returns ``{name: library path}``. Libraries stay registered for the life of the process
    (ORT requires every session using one to be gone before it is unregistered).

    Raises:
        OptionsError: a library is missing, the name is taken by another library, the installed
            onnxruntime has no plugin EP API (before 1.23), or ORT refuses the library.
    """
    ort = onnxruntime()
    if not hasattr(ort, "register_execution_provider_library"):
        raise OptionsError(
            f"ep_libraries: onnxruntime {ort.__version__} ({flavour()}) has no plugin EP API; "
            "it came with onnxruntime 1.23 (`pip install -U onnxruntime`)"
        )
    done: dict[str, str] = {}
    with _lock:
        for given_name, source in libraries.items():
            path = library_path(source)
            name = _ep_name_of(source, given_name)
            known = _registered.get(name)
            if known is not None:
                if known != path:
                    raise OptionsError(
                        f"ep_libraries: {name!r} is already registered with {known}; one library per name"
                    )
                done[name] = path
                continue
            try:
                ort.register_execution_provider_library(name, path)
            except Exception as e:
                raise OptionsError(f"ep_libraries: onnxruntime refused {path} as {name!r}: {e}") from None
            _registered[name] = path
            done[name] = path
    return done


def _device_type(device: Any) -> str:
    return str(device.device.type).rsplit(".", 1)[-1].lower()


def _devices_text(devices: Sequence[Any]) -> str:
    return ", ".join(f"{d.ep_name} on {_device_type(d)}" for d in devices) or "none"


def select_devices(options: Options, providers: Sequence[str]) -> list[Any]:
    """The ``OrtEpDevice`` objects a session of ``options`` runs on, in ``providers``' order:
    each provider's devices (of type ``ep_device`` when set), then the CPU provider's device
    when the CPU provider is in ``providers`` or no device was found. Empty when ``options``
    select by ORT's policy alone (``ep_policy``)."""
    ort = onnxruntime()
    listed = list(ort.get_ep_devices())
    chosen: list[Any] = []
    for provider in providers:
        for d in listed:
            if d.ep_name != provider or d in chosen:
                continue
            if provider != CPU and options.ep_device and _device_type(d) != options.ep_device:
                continue
            chosen.append(d)
    return chosen


def device_problem(options: Options, providers: Sequence[str]) -> str | None:
    """Why the device API cannot give a session of ``options`` the providers it asks for (a
    provider with no device of the asked type), or None. ORT's policy (``ep_policy``) chooses
    among whatever it lists: nothing to check."""
    if not uses_device_api(options) or options.ep_policy:
        return None
    ort = onnxruntime()
    listed = list(ort.get_ep_devices())
    chosen = select_devices(options, providers)
    missing = [p for p in providers if p != CPU and not any(d.ep_name == p for d in chosen)]
    if not missing:
        return None
    kind = f" {options.ep_device.upper()}" if options.ep_device else ""
    return (
        f"no{kind} device for {', '.join(missing)} (onnxruntime {ort.__version__} lists: {_devices_text(listed)}); "
        "a plugin EP lists only the devices its library supports on this machine"
    )


def uses_device_api(options: Options) -> bool:
    """Whether sessions of ``options`` choose their providers through ORT's EP device API
    (plugin libraries, a device type or a selection policy) instead of a provider list."""
    return bool(options.ep_libraries or options.ep_device or options.ep_policy)


def apply_devices(so: Any, options: Options, providers: Sequence[str], provider_options: Sequence[Mapping[str, str]]) -> None:
    """Put ``providers`` on the session options ``so`` through the EP device API: ORT's
    ``ep_policy`` when set, else the devices of :func:`select_devices` with each provider's
    options.

    Raises:
        OptionsError: no device for a provider asked for.
    """
    ort = onnxruntime()
    if options.ep_policy:
        policy = ort.OrtExecutionProviderDevicePolicy.__members__[options.ep_policy.upper()]
        so.set_provider_selection_policy(policy)
        return
    problem = device_problem(options, providers)
    if problem:
        raise OptionsError(f"providers: {problem}")
    per_provider = dict(zip(providers, provider_options))
    chosen = select_devices(options, providers)
    for provider in dict.fromkeys(d.ep_name for d in chosen):
        devices = [d for d in chosen if d.ep_name == provider]
        so.add_provider_for_devices(devices, dict(per_provider.get(provider, {})))


def ep_nodes(session: Any) -> dict[str, int] | None:
    """Nodes per execution provider in a session made with
    ``session.record_ep_graph_assignment_info`` (None where ORT cannot say: before 1.23)."""
    get = getattr(session, "get_provider_graph_assignment_info", None)
    if get is None:
        return None
    counts: dict[str, int] = {}
    try:
        for subgraph in get():
            counts[subgraph.ep_name] = counts.get(subgraph.ep_name, 0) + len(subgraph.get_nodes())
    except Exception:
        return None
    return counts


def records_assignment() -> bool:
    """Whether the installed onnxruntime can record which provider runs each node (1.23+)."""
    return ort_version() >= (1, 23)


__all__ += ["records_assignment", "DEVICE_TYPES", "EP_POLICIES"]

"""One place for every setting of ort-lazy.

Every field of :class:`Options` can also be set by an ``ORT_LAZY_<FIELD>`` environment
variable (upper case). Explicit arguments win over the environment, the environment wins
over the defaults. Invalid values raise :class:`OptionsError` naming the setting and the
accepted values.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Mapping
from typing import Any

from . import metrics

__all__ = [
    "Options",
    "OptionsError",
    "RUN_TYPES",
    "PRECISIONS",
    "TORCH_PREFERRED_OPS",
    "KNOWN_PROVIDERS",
    "PROVIDER_ALIASES",
    "DEVICE_TYPES",
    "EP_POLICIES",
    "canonical_provider",
    "ENV_PREFIX",
    "ENV_VARIABLES",
    "apply_session_options",
    "unknown_variables",
]

#: Prefix of every environment variable ort-lazy reads.
ENV_PREFIX = "ORT_LAZY_"

#: ``ORT_LAZY_*`` variables that are not :class:`Options` fields, and what reads them.
ENV_VARIABLES = {
    "ORT_LAZY_METRICS_FILE": "one JSON line per compiled graph is appended to this file",
    "ORT_LAZY_BUILD_BRIDGE": "setup.py: 0 installs without the compiled bridge",
    "ORT_LAZY_BUILD_CONFIG": "setup.py: the bridge's build type (Release, RelWithDebInfo, Debug)",
    "ORT_LAZY_ZOO_FULL": "tests: run the whole model zoo",
    "ORT_LAZY_FULL_TIER": "tests: run the full tier (every test marked full, the whole zoo, every OpInfo case)",
    "ORT_LAZY_OPINFO": "tests: the OpInfo cases (fast, full or off)",
    "ORT_LAZY_OPINFO_FLAVOUR": "tests: the onnxruntime flavour the OpInfo suite is checked as",
    "ORT_LAZY_TEST_FORKSERVER": "tests: 0 starts every test process as a new interpreter (tests/forkserver.py)",
    "ORT_LAZY_TEST_WHEEL": "tests: the wheel build.py built for the packaging tests",
}

#: Numeric precisions of inference graphs (``precision``): ``fp32`` keeps the model's own dtypes;
#: ``int8-dynamic`` quantizes the weights of matrix products to int8 and their activations per
#: call (ORT's dynamic quantization: faster on CPUs with int8 dot-product units, approximate);
#: ``fp16`` computes the region in float16 between float32 edges where the provider has float16
#: kernels for its matrix products (a GPU's tensor cores), exponentials, logarithms, powers and
#: sums in float32 (``ort_lazy.export.half``; approximate).
PRECISIONS = ("fp32", "int8-dynamic", "fp16")

#: ``torch_preferred_ops`` by default: the convolution and batch-norm gradients. ORT's inference
#: builds have no kernels for them, so on ORT they run as decompositions (transposed and
#: batched convolutions, a dozen elementwise and reduction nodes per batch norm), slower than
#: PyTorch's fused kernels: a ResNet-18 training step on 2 CPU cores took 1.44x eager with
#: them on ORT and 1.11x in PyTorch, gradients the same. Also max pooling that returns its
#: indices (training, where the backward reads them; in PyTorch as well): ORT's MaxPool with
#: indices is its generic kernel, 1.9-2.4x PyTorch's time on 2 cores (ResNet's stem pooling
#: 12.1 against 6.4 ms). Pooling without indices (inference) stays on ORT's fast kernel; the
#: 2-d pooling's gradient runs PyTorch's kernel too (ORT runs it as a ``ScatterElements``
#: decomposition: ResNet's stem pooling, [2, 64, 112, 112], 2.7 ms against 0.9 ms; [8, 32, 56,
#: 56] 1.2 against 0.4 ms; [4, 16, 32, 32] 0.17 against 0.12 ms; the 3-d one measured the same
#: either way and stays on ORT). The
#: ReLU gradient (``aten.threshold_backward``) on more than 65536 elements: ORT has no select
#: faster than five elementwise passes there (its ``Where`` is slower still); smaller ones run
#: on ORT (the region boundary would cost more). A TransformerEncoderLayer training step: 0.98x
#: eager with it in PyTorch, 1.02x on ORT; ResNet-18 1.21x against 1.26x. And convolutions of
#: at least 4 MFLOP whose weight ORT would read as a graph input on the CPU (training; inference
#: without ``prepack_weights``): ORT's blocked (NCHWc) kernels need the weight as an
#: initializer, and its generic one is about 25% slower than PyTorch's oneDNN kernel (ResNet-18's
#: training forward: 50 against 40 ms of convolutions; the step 1.08x eager against 1.22x on
#: ORT); smaller ones cost less on ORT than a region boundary (MobileNetV3-small: 1.54x eager
#: with all of them in PyTorch, 1.36-1.38x with the small ones on ORT; ``support.CONV_MIN_FLOPS``).
#: Inference convolutions with prepacked or frozen weights, and every convolution on a GPU, run
#: on ORT.
TORCH_PREFERRED_OPS = frozenset(
    {
        "aten.convolution_backward",
        "aten.native_batch_norm_backward",
        "aten.max_pool2d_with_indices",
        "aten.max_pool2d_with_indices_backward",
        "aten.max_pool3d_with_indices",
        "aten.threshold_backward",
        "aten.convolution",
    }
)

#: Run types: ``ort`` runs supported regions on ORT; ``pytorch`` captures as usual but runs
#: every region in PyTorch; ``debug`` runs both, compares and times them.
RUN_TYPES = ("ort", "pytorch", "debug")

#: Execution providers ort-lazy knows how to feed (``ort_lazy.runtime.providers.TRAITS`` says
#: what each reads). Others are accepted when the installed onnxruntime reports them as
#: available, or when a plugin library registered through ``ep_libraries`` provides them.
KNOWN_PROVIDERS = (
    "CPUExecutionProvider",
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "ROCMExecutionProvider",
    "MIGraphXExecutionProvider",
    "DmlExecutionProvider",
    "OpenVINOExecutionProvider",
    "CoreMLExecutionProvider",
    "QNNExecutionProvider",
    "NnapiExecutionProvider",
    "XnnpackExecutionProvider",
    "WebGpuExecutionProvider",
    "DnnlExecutionProvider",
    "VitisAIExecutionProvider",
    "RknpuExecutionProvider",
)

#: Short names users write for the providers (case-insensitive).
PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "dml": "DmlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "ov": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "nnapi": "NnapiExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
    "vitisai": "VitisAIExecutionProvider",
    "rknpu": "RknpuExecutionProvider",
}

#: Device types a plugin EP (or any provider ORT lists devices for) can be asked to run on
#: (``ep_device``): ORT's ``OrtHardwareDeviceType`` names.
DEVICE_TYPES = ("cpu", "gpu", "npu")

#: ORT's device selection policies (``ep_policy``: ``OrtExecutionProviderDevicePolicy``).
EP_POLICIES = ("default", "prefer_cpu", "prefer_gpu", "prefer_npu", "max_performance", "max_efficiency", "min_overall_power")


_TENSORRT = "TensorrtExecutionProvider"


def canonical_provider(name: str) -> str:
    """ORT's name for a provider written as a short name (``openvino``) or as ORT's own."""
    text = str(name).strip()
    return PROVIDER_ALIASES.get(text.lower(), text)


class OptionsError(ValueError):
    """An invalid ort-lazy setting (argument or ``ORT_LAZY_*`` variable)."""


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings shared by every front door (dynamo, fx, lazy, jit).

    Attributes:
        providers: ORT execution providers in priority order. ``None`` infers them from the
            device of the inputs: CUDA (then CPU) for CUDA tensors, CPU otherwise.
            Short names are accepted (``"openvino"``, ``"tensorrt,cuda,cpu"``:
            :data:`PROVIDER_ALIASES`); the region's ONNX model is written in the form every
            provider of the list reads (``ort_lazy.runtime.providers.region_form``). TensorRT
            alone (``"tensorrt"``) becomes TensorRT, CUDA, CPU: ORT runs what TensorRT refuses
            on the providers after it.
        provider_options: per-provider option dicts, keyed by ORT's name or a short name, e.g.
            ``{"cuda": {"device_id": "0"}}``, ``{"openvino": {"device_type": "GPU"}}``. In the
            environment: a JSON object.
        ep_libraries: plugin execution providers (ORT 1.23+) to register: registration name ->
            library path or an installed package that ships one (``get_library_path()``), e.g.
            ``{"OpenVINOExecutionProvider": "onnxruntime_ep_openvino"}``; a plain string names
            one package (its ``get_ep_name()`` names it). Sessions then choose their providers
            through ORT's EP device API; ``providers`` defaults to the plugins' names, then CPU.
        ep_device: run on the devices of this type (:data:`DEVICE_TYPES`: ``cpu``, ``gpu``,
            ``npu``) that ORT lists for the providers (``onnxruntime.get_ep_devices()``); a
            provider with no such device is an error, never a silent move to another one.
        ep_policy: let ORT choose the devices by policy (:data:`EP_POLICIES`, e.g.
            ``prefer_gpu``) among every provider it lists devices for, when no ``providers``
            are given.
        session_options: ORT ``SessionOptions`` attributes (``intra_op_num_threads``,
            ``graph_optimization_level`` ...) or session config entries (keys with a dot,
            e.g. ``session.intra_op.allow_spinning``). They win over ort-lazy's defaults:
            intra-op threads follow ``torch.get_num_threads()`` (one thread for small regions),
            ORT's memory pattern off. In the environment: a JSON object.
        min_block_size: smallest number of compute ops a region needs to run on ORT;
            smaller regions stay in PyTorch.
        torch_executed_ops: aten ops forced to stay in PyTorch (``"aten.relu"``,
            ``"aten.relu.default"`` or ``"aten::relu"``). In the environment: names separated by
            commas (``aten.relu,aten::gelu``).
        torch_preferred_ops: aten ops kept in PyTorch because its kernel beats ORT's form of
            them (:data:`TORCH_PREFERRED_OPS`: gradient ops ORT's inference builds have no
            kernel for, which ORT runs as decompositions); ``()`` (``"none"``) runs them on ORT too.
            Graphs that only update state in place (an optimizer's step) run as dynamo captured
            them, with PyTorch's in-place kernels, unless this is empty. Measured on 2 CPU cores:
            ResNet-18 training 1.44x eager with the gradients on ORT, 1.11-1.21x with them in
            PyTorch; max pooling that returns its indices (training) takes 1.9-2.4x PyTorch's
            time on ORT's generic kernel and the 2-d pooling's gradient 1.4-3x as ORT's scatter;
            convolutions of at least 4 MFLOP whose weight ORT would get as a graph input on the
            CPU (training, or ``prepack_weights=False``) run slower than PyTorch's oneDNN
            kernel, while prepacked, frozen, smaller and GPU convolutions stay on ORT.
        freeze_weights: inference only: bake parameters into the ONNX model as initializers
            (lets ORT prepack weights; the model snapshots them at compile time and never
            follows later changes).
        prepack_weights: inference graphs bind parameters as ORT initializers on their own
            memory (no copy), so ORT prepacks them as it does for an exported model; a
            parameter changed in place or replaced is noticed at the next call and the session
            rebuilt: results never use stale weights. On a GPU they are copied into the model
            instead (up to 1 GiB; ORT keeps a device copy). Every module instance that dynamo
            serves with one graph (a class's instances, layers compiled one by one) gets
            sessions bound to its own weights, 8 at most, then their weights as inputs. Tensors
            made under ``torch.inference_mode()`` track no version counter and stay graph
            inputs. ``False`` passes them as graph inputs.
        precision: inference graphs' numeric precision (:data:`PRECISIONS`); ``int8-dynamic``
            quantizes weight matrix products (ORT's dynamic quantization), ``fp16`` computes the
            inference regions that hold the model's weights in float16 between float32 edges
            where the provider has float16 kernels for the matrix products (ORT's CUDA
            provider; ORT's CPU provider has none: float32 there, with a warning): exponentials,
            logarithms, powers and sums stay in float32, constants are clipped to float16's
            range. Both approximate (``explain`` shows the error against eager; see the
            performance guide for figures); the model is rebuilt when a parameter changes.
            Training graphs keep their dtypes (with one warning). With TensorRT, ``fp16`` also
            lets TensorRT build float16 engines; ``int8-dynamic`` is refused (TensorRT's int8
            needs calibration).
        fast_math: trade eager's exact results in two corners for speed, as a compiler's
            fast-math mode does (off by default; every graph, inference and training): ORT's
            own approximate logistic on the CPU (``sigmoid``, ``silu`` as ORT's fused
            ``QuickGelu``: within about 1e-7 absolute, but 0 below -18 where eager's value is
            tiny but positive) instead of ort-lazy's exact four-pass form, and max pooling
            without eager's NaN rule (a window holding a NaN may give a number; dynamo / FX
            graphs), which on a GPU lets ORT keep blocked-layout convolutions fused across the
            pooling and on the CPU drops the NaN check (one pass over the pooling's input).
            ``explain`` shows the error against eager. Measured on 2 CPU cores: EfficientNet-B0
            inference 1.5x faster, ResNet-18 and a Llama decoder 3-4%.
        dynamic: ``True`` exports symbolic dims where the graph has them, ``False`` forces
            one model per concrete input shape.
        trt_profile_scale: TensorRT's shape profiles (``ort_lazy.runtime.tensorrt``): each
            symbolic dim reaches this multiple of the size the profile is built for (min 1, opt
            that size); a call past it gets a session with a wider profile. At least 1.
        cache_size: maximum number of ORT sessions kept (LRU).
        run_type: ``ort``, ``pytorch`` or ``debug`` (see :data:`RUN_TYPES`).
        rtol: relative tolerance used by the ``debug`` run type.
        atol: absolute tolerance used by the ``debug`` run type.
        allow_spinning: ORT intra-op thread spinning. ``None`` (default): for dynamo / FX
            graphs threads spin within a run and park when it ends, so PyTorch work between
            runs is not starved; LazyTensor groups do the same; TorchScript groups never spin
            (measured slower next to TorchScript's own ops).
            ``True`` / ``False`` force it either way.
        park_torch_threads: while a CPU ORT run uses several threads, PyTorch's idle OpenMP
            workers wait blocked instead of busy-waiting for their next parallel region (they
            spin for milliseconds after each PyTorch op and would share ORT's cores); needs
            the compiled bridge built with OpenMP, otherwise runs go ahead without it.
        dump_dir: when set, every compiled region writes its ONNX model, source graph and
            input schema there.
        cache_dir: when set, exported ONNX models persist there across processes.
        autotune: time each region on ORT and in PyTorch at compile time and keep the faster.
        nvtx: emit NVTX ranges around export, session creation and every ORT run (for
            Nsight Systems; needs a CUDA build of torch).
        strict: raise the exception instead of running a graph in PyTorch when compiling it
            fails (for debugging ort-lazy itself; the default never lets a compile failure
            reach the model).
    """

    providers: tuple[str, ...] | None = None
    provider_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    ep_libraries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ep_device: str | None = None
    ep_policy: str | None = None
    session_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    min_block_size: int = 1
    torch_executed_ops: frozenset[str] = frozenset()
    torch_preferred_ops: frozenset[str] = TORCH_PREFERRED_OPS
    freeze_weights: bool = False
    prepack_weights: bool = True
    precision: str = "fp32"
    fast_math: bool = False
    dynamic: bool = True
    trt_profile_scale: float = 2.0
    cache_size: int = 64
    run_type: str = "ort"
    rtol: float = 1e-3
    atol: float = 1e-5
    allow_spinning: bool | None = None
    park_torch_threads: bool = True
    dump_dir: str | None = None
    cache_dir: str | None = None
    autotune: bool = False
    nvtx: bool = False
    strict: bool = False

    def __post_init__(self) -> None:
        _set = object.__setattr__
        _set(self, "ep_libraries", _parse_libraries(self.ep_libraries))
        if self.providers is not None:
            _set(self, "providers", _parse_providers(self.providers, "providers", plugins=tuple(self.ep_libraries)))
        _set(self, "provider_options", _parse_provider_options(self.provider_options))
        for name, accepted in (("ep_device", DEVICE_TYPES), ("ep_policy", EP_POLICIES)):
            value = getattr(self, name)
            if value is not None and str(value).strip() != "":
                text = str(value).strip().lower().replace("-", "_")
                if text not in accepted:
                    raise OptionsError(f"{name}: unknown value {value!r}; accepted: {', '.join(accepted)}")
                _set(self, name, text)
            else:
                _set(self, name, None)
        _set(self, "session_options", _parse_mapping(self.session_options, "session_options"))
        if self.session_options:
            _check_session_options(self.session_options)
        _set(self, "min_block_size", _parse_int(self.min_block_size, "min_block_size", 1))
        _set(self, "cache_size", _parse_int(self.cache_size, "cache_size", 1))
        for name in ("torch_executed_ops", "torch_preferred_ops"):
            _set(self, name, _parse_ops(getattr(self, name), name))
        for name in (
            "freeze_weights", "prepack_weights", "fast_math", "dynamic", "autotune", "nvtx", "strict",
            "park_torch_threads",
        ):
            _set(self, name, _parse_bool(getattr(self, name), name))
        if self.allow_spinning is not None:
            _set(self, "allow_spinning", _parse_bool(self.allow_spinning, "allow_spinning"))
        precision = str(self.precision).strip().lower()
        if precision not in PRECISIONS:
            raise OptionsError(f"precision: unknown value {self.precision!r}; accepted: {', '.join(PRECISIONS)}")
        _set(self, "precision", precision)
        _set(self, "trt_profile_scale", _parse_scale(self.trt_profile_scale, "trt_profile_scale"))
        if self.providers == (_TENSORRT,) and not (self.ep_libraries or self.ep_device or self.ep_policy):
            # ORT gives what TensorRT's parser refuses to the providers after it
            _set(self, "providers", (_TENSORRT, "CUDAExecutionProvider", "CPUExecutionProvider"))
        if precision == "int8-dynamic" and self.providers and _TENSORRT in self.providers:
            raise OptionsError(
                "precision: 'int8-dynamic' is ORT's dynamic quantization, whose int8 ops TensorRT does not run; "
                "TensorRT's own int8 needs a calibration table or a QDQ model (provider_options={'tensorrt': "
                "{'trt_int8_enable': 1, 'trt_int8_calibration_table_name': ...}}); with TensorRT use precision "
                "'fp16' or 'fp32'"
            )
        run_type = str(self.run_type).strip().lower()
        if run_type not in RUN_TYPES:
            raise OptionsError(
                f"run_type: unknown value {self.run_type!r}; accepted: {', '.join(RUN_TYPES)}"
            )
        _set(self, "run_type", run_type)
        for name in ("rtol", "atol"):
            _set(self, name, _parse_tolerance(getattr(self, name), name))

    @property
    def torch_ops(self) -> frozenset[str]:
        """Every op name kept in PyTorch by option: ``torch_executed_ops`` and
        ``torch_preferred_ops`` together."""
        return self.torch_executed_ops | self.torch_preferred_ops

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Options:
        """Build options from ``ORT_LAZY_*`` variables, then apply ``overrides``.

        Raises:
            OptionsError: a variable or an override is invalid (the message names it).
        """
        env = os.environ if environ is None else environ
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(overrides) - names
        if unknown:
            raise OptionsError(
                f"unknown option(s) {sorted(unknown)}; accepted: {', '.join(sorted(names))}"
            )
        for var, message in unknown_variables(env):
            metrics.warn_once(f"env:{var}", "ort-lazy: %s", message)
        values: dict[str, Any] = {}
        for name in names:
            var = ENV_PREFIX + name.upper()
            if var in env and env[var] != "":
                values[name] = (var, env[var])
        kwargs: dict[str, Any] = {}
        for name, (var, raw) in values.items():
            try:
                cls(**{name: raw})
            except OptionsError as e:
                raise OptionsError(f"{var}={raw!r}: {e}") from None
            kwargs[name] = raw
        kwargs.update({k: v for k, v in overrides.items() if v is not None or k == "providers"})
        return cls(**kwargs)

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes`` applied (validated)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise OptionsError(f"unknown option(s) {sorted(unknown)}; accepted: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **changes)

    def resolve_providers(self, device: Any) -> tuple[str, ...]:
        """Execution providers for tensors living on ``device`` (a torch.device or None)."""
        if self.providers is not None:
            return self.providers
        if device is not None and getattr(device, "type", None) == "cuda":
            return ("CUDAExecutionProvider", "CPUExecutionProvider")
        return ("CPUExecutionProvider",)

    def key(self) -> tuple[Any, ...]:
        """A hashable summary of the fields that change the compiled result."""
        return (
            self.providers,
            json.dumps(self.provider_options, sort_keys=True, default=str),
            json.dumps(self.ep_libraries, sort_keys=True),
            self.ep_device,
            self.ep_policy,
            json.dumps(self.session_options, sort_keys=True, default=str),
            self.freeze_weights,
            self.prepack_weights,
            self.precision,
            self.fast_math,
            self.dynamic,
        )


def _parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise OptionsError(f"{name}: expected a boolean (0/1, true/false), got {value!r}")


def _parse_int(value: Any, name: str, minimum: int) -> int:
    try:
        result = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise OptionsError(f"{name}: expected an integer >= {minimum}, got {value!r}") from None
    if isinstance(result, bool) or result < minimum:
        raise OptionsError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return result


def _parse_scale(value: Any, name: str) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{name}: expected a number >= 1, got {value!r}") from None
    if not (1.0 <= result < float("inf")):
        raise OptionsError(f"{name}: expected a finite number >= 1, got {value!r}")
    return result


def _parse_tolerance(value: Any, name: str) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{name}: expected a non-negative number, got {value!r}") from None
    if not (result >= 0.0) or result == float("inf"):
        raise OptionsError(f"{name}: expected a finite non-negative number, got {value!r}")
    return result


def _parse_providers(value: Any, name: str, plugins: tuple[str, ...] = ()) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        canonical = canonical_provider(item)
        if canonical not in KNOWN_PROVIDERS and canonical not in plugins and canonical not in _available_providers():
            accepted = ", ".join(sorted(set(KNOWN_PROVIDERS) | set(PROVIDER_ALIASES)))
            close = difflib.get_close_matches(item.lower(), [*PROVIDER_ALIASES, *(p.lower() for p in KNOWN_PROVIDERS)], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise OptionsError(
                f"{name}: unknown execution provider {item!r}; {hint}accepted: {accepted} (a plugin EP's "
                "name is accepted with ep_libraries naming its library)"
            )
        if canonical not in out:
            out.append(canonical)
    if not out:
        raise OptionsError(f"{name}: expected at least one execution provider")
    return tuple(out)


def _parse_provider_options(value: Any) -> dict[str, Any]:
    """``provider_options`` with every key ORT's provider name (short names accepted)."""
    mapping = _parse_mapping(value, "provider_options")
    out: dict[str, Any] = {}
    for key, opts in mapping.items():
        if not isinstance(opts, Mapping):
            raise OptionsError(f"provider_options: {key!r} must map to a dict of that provider's options, got {opts!r}")
        out[canonical_provider(key)] = {str(k): v for k, v in opts.items()}
    return out


def _parse_libraries(value: Any) -> dict[str, str]:
    """``ep_libraries``: a mapping name -> library or package, a JSON object, or a string of
    ``name=source`` / ``source`` items separated by commas (an empty name: the package names it)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            value = _parse_mapping(text, "ep_libraries")
        else:
            value = {}
            for item in filter(None, (i.strip() for i in text.split(","))):
                name, sep, source = item.partition("=")
                value[canonical_provider(name.strip()) if sep else ""] = (source if sep else name).strip()
    if not isinstance(value, Mapping):
        raise OptionsError(f"ep_libraries: expected a mapping of EP name to library path or package, got {value!r}")
    out: dict[str, str] = {}
    for name, source in value.items():
        if not isinstance(source, str) or not source.strip():
            raise OptionsError(f"ep_libraries: {name!r} must name a library path or package, got {source!r}")
        out[canonical_provider(name) if name else ""] = source.strip()
    return out


def _available_providers() -> list[str]:
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # pragma: no cover - onnxruntime missing is reported elsewhere
        return []


def _parse_mapping(value: Any, name: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise OptionsError(f"{name}: expected a JSON object, got {value!r} ({e})") from None
    if not isinstance(value, Mapping):
        raise OptionsError(f"{name}: expected a mapping (JSON object), got {value!r}")
    return {str(k): v for k, v in value.items()}


def _parse_ops(value: Any, name: str) -> frozenset[str]:
    if isinstance(value, str) and value.strip().lower() == "none":
        return frozenset()  # an empty variable means unset: "none" is the empty list
    items = value.split(",") if isinstance(value, str) else list(value)
    out = set()
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        op = normalize_op_name(text)
        _check_op(op, text, name)
        out.add(op)
    return frozenset(out)


def _check_op(op: str, text: str, name: str) -> None:
    """Raise :class:`OptionsError` unless torch has the operator (or overload) ``op`` names."""
    import torch

    from .opnames import lookup, suggest

    found = lookup(op)
    if isinstance(found, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return
    parts = op.split(".")
    packet = lookup(".".join(parts[:2])) if len(parts) == 3 else None
    if isinstance(packet, torch._ops.OpOverloadPacket):
        overloads = [o or "default" for o in packet.overloads()]
        close = difflib.get_close_matches(parts[2], overloads, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(f'{parts[0]}.{parts[1]}.{o}' for o in close)}?" if close else (
            f"its overloads: {', '.join(sorted(overloads))}"
        )
        raise OptionsError(f"{name}: {parts[0]}.{parts[1]} has no overload {parts[2]!r} ({text!r}); {hint}")
    close = suggest(op) if "." in op else suggest(f"aten.{op}")
    hint = f"did you mean {', '.join(close)}?" if close else "expected names like aten.relu, aten.relu.default or aten::relu"
    raise OptionsError(f"{name}: torch has no operator {text!r}; {hint}")


def normalize_op_name(name: str) -> str:
    """``aten::relu`` / ``torch.ops.aten.relu.default`` / ``aten.relu`` -> ``aten.relu[.overload]``."""
    text = name.strip()
    if text.startswith("torch.ops."):
        text = text[len("torch.ops.") :]
    return text.replace("::", ".")


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(variable, message)`` for every ``ORT_LAZY_*`` variable in ``environ`` that ort-lazy does
    not read (a typo would otherwise be ignored); the message suggests the closest known name."""
    known = [ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Options)] + list(ENV_VARIABLES)
    out = []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in known:
            continue
        close = difflib.get_close_matches(var, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}"
        out.append((var, f"unknown environment variable {var} is ignored; {hint}"))
    return out


def _session_option_names(cls: type) -> list[str]:
    return sorted(a for a in dir(cls) if not a.startswith("_") and isinstance(getattr(cls, a, None), property))


def apply_session_options(so: Any, session_options: Mapping[str, Any]) -> None:
    """Apply ``session_options`` to an ``onnxruntime.SessionOptions``.

    Keys with a dot are session config entries (``session.intra_op.allow_spinning``; booleans
    become ``1``/``0``); other keys must be ``SessionOptions`` attributes, enum-valued ones also
    accept the member's name (``"ORT_ENABLE_BASIC"``).

    Raises:
        OptionsError: an unknown key (with the closest names) or a value ORT rejects.
    """
    cls = type(so)
    names = _session_option_names(cls)
    for key, value in session_options.items():
        if "." in key:
            text = ("1" if value else "0") if isinstance(value, bool) else str(value)
            try:
                so.add_session_config_entry(key, text)
            except Exception as e:  # ORT refuses the entry
                raise OptionsError(f"session_options: config entry {key}={value!r} rejected by ORT: {e}") from None
            continue
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"accepted: {', '.join(names)}"
            raise OptionsError(
                f"session_options: onnxruntime.SessionOptions has no attribute {key!r}; {hint} "
                "(session config entries are keys with a dot, e.g. session.intra_op.allow_spinning)"
            )
        current = getattr(so, key)
        members = getattr(type(current), "__members__", None)
        if members and isinstance(value, str):
            wanted = value.strip().upper().removeprefix("ORT_")
            match = next((m for m in members if m.removeprefix("ORT_") == wanted), None)
            if match is None:
                raise OptionsError(f"session_options: {key}={value!r}; accepted: {', '.join(members)}")
            value = members[match]
        elif members and isinstance(value, int) and not isinstance(value, bool):
            match = next((m for m, v in members.items() if int(v) == value), None)
            if match is None:
                raise OptionsError(f"session_options: {key}={value!r}; accepted: {', '.join(members)}")
            value = members[match]
        try:
            setattr(so, key, value)
        except (TypeError, ValueError, RuntimeError):
            expected = type(current).__name__
            raise OptionsError(f"session_options: {key}={value!r} rejected by ORT (expected: {expected})") from None


def _check_session_options(session_options: Mapping[str, Any]) -> None:
    """Apply ``session_options`` to a throwaway ``SessionOptions``, so a bad key or value is an
    :class:`OptionsError` when the options are made, not a fallback at session creation."""
    try:
        import onnxruntime
    except ImportError:  # pragma: no cover - a missing onnxruntime is reported where it is needed
        return
    apply_session_options(onnxruntime.SessionOptions(), session_options)

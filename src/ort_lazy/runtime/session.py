"""ORT sessions: creation, a bounded thread-safe cache, and zero-copy runs through IOBinding.

Inputs are bound by data pointer (no copy unless a tensor is non-contiguous); outputs are
torch tensors allocated up front and bound by pointer when their shapes are static, otherwise
ORT allocates them and they cross to torch through DLPack. Either way no output is copied.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from .. import metrics
from ..debug.nvtx import nvtx_range
from ..options import Options, OptionsError, apply_session_options
from ..specs import TORCH_TO_ONNX, OrtModel, TensorSpec, dim_symbols, parse_dim
from . import _ort, tensorrt
from . import providers as eps
from .flavour import max_ir_version, onnxruntime
from .quirks import (
    EXACT_SIGMOID_FACT,
    MATMUL_TRANSPOSES_FACT,
    disabled_optimizers,
    exact_sigmoid,
    fuse_matmul_transposes,
    model_vector_matmul,
)
from .threads import parking

__all__ = [
    "SessionCache",
    "session_cache",
    "create_session",
    "OrtRunner",
    "OrtRunError",
    "OrtInputError",
    "NUMPY_TYPES",
    "ORT_DEVICES",
]

logger = logging.getLogger("ort_lazy")

#: Device types ORT execution providers read tensors from; tensors anywhere else (meta, mps,
#: xpu, privateuse ...) are never bound.
ORT_DEVICES = ("cpu", "cuda")

# numpy element types for IOBinding; bfloat16 has none and is passed as its ONNX enum.
NUMPY_TYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
    torch.bfloat16: 16,
}


class OrtRunError(RuntimeError):
    """ORT failed to create a session or to run one; callers fall back to PyTorch."""

    #: the runner is unusable from now on (False: only these inputs cannot run on it)
    lasting = True


class OrtInputError(OrtRunError):
    """These inputs cannot be bound to this runner (a device ORT cannot read, another GPU);
    the call runs in PyTorch, the runner stays usable for other inputs."""

    lasting = False


class OrtCheckError(OrtInputError):
    """A check output of the model (:attr:`~ort_lazy.specs.OrtModel.checks`) is set: these
    inputs need the exact form of an op the model took a fast form of; the call runs in
    PyTorch."""


class SessionCache:
    """A bounded LRU of ORT sessions, safe to use from many threads.

    An entry can depend on tensors the cache holds no reference to (a session reading its
    initializers from their memory): :meth:`drop_with` ends the entry when one of them dies, so
    no later tensor that happens to get the same address is mistaken for it.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}
        # keys whose tensors died; appended by finalizers (any thread, maybe inside a locked
        # section of this one: so no lock there), removed before every lookup
        self._dead: collections.deque[Hashable] = collections.deque()

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            self._purge()
            return key in self._items

    def drop_with(self, key: Hashable, tensors: Iterable[torch.Tensor]) -> None:
        """Forget ``key``'s entry as soon as any of ``tensors`` is freed."""
        for t in tensors:
            weakref.finalize(t, self._dead.append, key)

    def _purge(self) -> None:
        while self._dead:
            self._items.pop(self._dead.popleft(), None)

    def get_or_create(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """The cached value for ``key``, or ``factory()`` stored under it (built once)."""
        with self._lock:
            self._purge()
            if key in self._items:
                self._items.move_to_end(key)
                metrics.increment("session_cache_hits")
                return self._items[key]
            build_lock = self._building.setdefault(key, threading.Lock())
        with build_lock:
            with self._lock:
                self._purge()
                if key in self._items:
                    self._items.move_to_end(key)
                    metrics.increment("session_cache_hits")
                    return self._items[key]
            value = factory()
            with self._lock:
                self._items[key] = value
                self._items.move_to_end(key)
                while len(self._items) > self.capacity:
                    self._items.popitem(last=False)
                self._building.pop(key, None)
            return value

    def values(self) -> list[Any]:
        """The cached entries, least recently used first."""
        with self._lock:
            self._purge()
            return list(self._items.values())

    def discard(self, key: Hashable) -> None:
        """Drop ``key``'s entry, if any (runners holding its session keep it)."""
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        """Drop every session."""
        with self._lock:
            self._items.clear()


_cache = SessionCache()
# ORT sessions (and their thread pools) are released while the interpreter is still whole,
# not during its teardown
atexit.register(_cache.clear)


def session_cache(capacity: int | None = None) -> SessionCache:
    """The process-wide session cache (``capacity`` updates its bound)."""
    if capacity is not None:
        _cache.capacity = capacity
    return _cache


def _session_options(options: Options, spinning: bool, threads: int) -> Any:
    ort = onnxruntime()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads  # session_options below may still set it
    # ORT's memory pattern plans one block for every intermediate of a run up front; without it
    # the arena reuses freed chunks: measured at the same speed and 20-45% less peak memory
    # (TransformerEncoderLayer inference 42.8 -> 29.3 MiB, training 169 -> 133 MiB)
    so.enable_mem_pattern = False
    try:
        apply_session_options(so, options.session_options)  # validated when the options were made
    except OptionsError as e:
        raise OrtRunError(str(e)) from None
    if "session.intra_op.allow_spinning" not in options.session_options:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if spinning and "session.force_spinning_stop" not in options.session_options:
        # spin within a run, but park the threads when it ends so the caller's PyTorch
        # code after the call is not starved
        so.add_session_config_entry("session.force_spinning_stop", "1")
    return so


def provider_options_for(
    provider: str,
    options: Options,
    device: torch.device,
    model: OrtModel | None = None,
    profile: tensorrt.Profile | None = None,
) -> dict[str, str]:
    """ORT provider options for ``provider`` on ``device``; the user's ``provider_options``
    always win.

    For CUDA and TensorRT, the session runs on the device's index and on torch's current
    stream (``user_compute_stream``), so ORT work is ordered with PyTorch work on that stream.
    CUDA's float32 products use TF32 exactly when torch's do (``use_tf32`` follows
    ``torch.backends.cuda.matmul.allow_tf32``, i.e. ``torch.set_float32_matmul_precision``;
    ORT's own default is TF32 on, which would make compiled results less precise than eager's).
    TensorRT gets its engine cache, float16 and the shape ``profile`` of
    :func:`ort_lazy.runtime.tensorrt.complete` (``model``: the model the session is for).
    """
    opts = {k: str(v) for k, v in options.provider_options.get(provider, {}).items()}
    if provider in ("CUDAExecutionProvider", tensorrt.TRT) and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        opts.setdefault("device_id", str(index))
        stream = ort_stream_handle(torch.cuda.current_stream(index).cuda_stream)
        opts.setdefault("has_user_compute_stream", "1")
        opts.setdefault("user_compute_stream", str(stream))
        if provider == "CUDAExecutionProvider":
            opts.setdefault("use_tf32", "1" if cuda_tf32() else "0")
    if provider == tensorrt.TRT:
        opts = tensorrt.complete(opts, options, model, profile)
        if device.type == "cuda" and tensorrt.is_off(opts.get("trt_fp16_enable", "0")) and not cuda_tf32():
            metrics.warn_once(
                "trt-tf32",
                "ort-lazy: TensorRT computes float32 products in TF32 where the GPU has it (its default; ORT's "
                "TensorRT provider has no option to turn it off), while torch's do not: results are about 1e-3 "
                "(relative) from eager's; the CUDA provider follows torch's setting",
            )
    return opts


#: CUDA's handle for the legacy default stream, the stream torch calls its default one
CUDA_STREAM_LEGACY = 1


def ort_stream_handle(torch_stream: int) -> int:
    """The ``user_compute_stream`` value that makes ORT run on the torch stream ``torch_stream``.

    torch's default stream reports the handle 0; ORT reads a user stream of 0 as none given and
    runs on a stream of its own, which is not ordered with torch's default stream (measured
    with onnxruntime-gpu 1.31: outputs read before they were written, inputs read before they
    were produced). ``cudaStreamLegacy`` (1) names that same default stream explicitly.
    """
    return torch_stream if torch_stream != 0 else CUDA_STREAM_LEGACY


def cuda_tf32() -> bool:
    """Whether torch lets float32 matrix products on CUDA use TF32 (off by default).

    torch has two switches: ``torch.backends.cuda.matmul.fp32_precision`` (``"tf32"`` /
    ``"ieee"``, or ``"none"`` to inherit ``torch.backends.fp32_precision``) and the older
    ``allow_tf32`` / ``torch.set_float32_matmul_precision``; the newer one decides when set.
    Reading the older one raises once both were used, so it is read last.
    """
    for holder in (torch.backends.cuda.matmul, torch.backends):
        precision = getattr(holder, "fp32_precision", None)
        if precision in ("tf32", "ieee"):
            return precision == "tf32"
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # both APIs used and neither new one set: torch's own default
        return False


def create_session(
    model: OrtModel,
    options: Options,
    device: torch.device,
    spinning: bool,
    threads: int | None = None,
    initializers: dict[str, torch.Tensor] | None = None,
    profile: tensorrt.Profile | None = None,
) -> tuple[Any, tuple[str, ...], dict[str, int] | None]:
    """Create an ORT session for ``model`` (not cached). Raises :class:`OrtRunError`.

    ``threads``: ORT intra-op threads; None follows PyTorch's count (``torch.set_num_threads``).
    ``initializers``: the tensors behind the model's external initializers
    (:attr:`OrtModel.external`), given to ORT without a copy. ``profile``: TensorRT's shape
    profile (:mod:`ort_lazy.runtime.tensorrt`). Returns the session, the providers it has and
    how many of the model's nodes each provider took (None where ORT cannot say).

    Where TensorRT cannot load, ORT's Python API falls back to CUDA and CPU with none of the
    provider options (no stream: its work would not be ordered with torch's); that session is
    dropped, TensorRT marked unusable in this process, and the session made again without it.
    """
    if threads is None:
        threads = torch.get_num_threads()
    ort = onnxruntime()
    providers = options.resolve_providers(device)
    device_api = eps.uses_device_api(options)
    if not device_api:
        providers = tensorrt.usable_providers(providers)
        available = set(ort.get_available_providers())
        missing = [p for p in providers if p not in available]
        if missing:
            raise OrtRunError(
                f"execution provider(s) {missing} not available in the installed "
                f"onnxruntime (available: {sorted(available)})"
            )
    provider_opts = [provider_options_for(p, options, device, model, profile) for p in providers]
    start = time.perf_counter()
    try:
        with nvtx_range(f"ort_lazy.session:{model.name}", options.nvtx):
            so = _session_options(options, spinning, threads)
            if eps.records_assignment():
                so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            if device_api:
                eps.apply_devices(so, options, providers, provider_opts)
            if initializers:
                off_host = sorted(n for n, t in initializers.items() if t.device.type != "cpu")
                if off_host:  # ORT reads external initializers on the host: a device pointer would crash it
                    raise OrtRunError(f"external initializers must be in host memory; {off_host[:3]} are not")
                names = list(initializers)
                so.add_external_initializers(names, [_ort.ortvalue_of(initializers[n]) for n in names])
            # a model exported for the CPU has its Sigmoids made exact already (export_graph);
            # fast_math keeps ORT's own
            done = options.fast_math or model.facts.get(EXACT_SIGMOID_FACT)
            exact = model.model_bytes if done else exact_sigmoid(model.model_bytes, providers)
            # the CPU's slow transposed products: rewritten at export, else here
            transposed_a = model.facts.get(MATMUL_TRANSPOSES_FACT)
            if transposed_a is None:
                exact, transposed_a = fuse_matmul_transposes(exact, providers)
            placement = {} if device_api else {"providers": list(providers), "provider_options": provider_opts}
            sess = ort.InferenceSession(
                _clamp_ir_version(exact),
                sess_options=so,
                disabled_optimizers=disabled_optimizers(
                    model.model_bytes, providers, model_vector_matmul(model), transposed_a
                ),
                **placement,
            )
    except OrtRunError:
        raise
    except OptionsError as e:
        raise OrtRunError(str(e)) from None
    except Exception as e:
        raise OrtRunError(f"ORT session creation failed for {model.name}: {_provider_error(e)}") from e
    made = tuple(sess.get_providers())
    if not device_api and tensorrt.TRT in providers and tensorrt.TRT not in made:
        del sess
        reason = tensorrt.library_problem() or f"onnxruntime made the session with {', '.join(made)}"
        tensorrt.mark_unusable(reason)
        if tensorrt.usable_providers(providers) == tuple(providers):  # nothing else to run on
            raise OrtRunError(f"TensorRT cannot run here: {reason}")
        return create_session(model, options, device, spinning, threads, initializers, profile)
    metrics.record_time("session_create", time.perf_counter() - start)
    metrics.increment("sessions_created")
    nodes = eps.ep_nodes(sess)
    if nodes:
        metrics.record_ep_nodes(nodes)
    return sess, made, nodes


def _provider_error(e: BaseException) -> str:
    """ORT's session error in a line or a few: an execution provider's own error (OpenVINO's
    reader, TensorRT's parser) follows ORT's long source location, which is cut away."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return text
    head = lines[0]
    if len(head) > 300:
        head = head[:120] + " ... " + head[-150:]
    return " | ".join([head, *lines[1:8]])[:1500]


def _leading_ir_version(model_bytes: bytes) -> int | None:
    """``ModelProto.ir_version`` when serialized first (field 1, varint), without importing onnx."""
    if not model_bytes or model_bytes[0] != 0x08:
        return None
    value, shift = 0, 0
    for byte in model_bytes[1:11]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    return None


def _clamp_ir_version(model_bytes: bytes) -> bytes:
    """Lower the model's IR version to what the installed ORT accepts, when needed."""
    limit = max_ir_version()
    version = _leading_ir_version(model_bytes)
    if version is not None and version <= limit:
        return model_bytes
    import onnx

    proto = onnx.ModelProto()
    proto.ParseFromString(model_bytes)
    if proto.ir_version <= limit:
        return model_bytes
    proto.ir_version = limit
    return proto.SerializeToString()


def _device_key(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return ("cpu", 0)


class OrtRunner:
    """Runs one :class:`OrtModel` on ORT with torch tensors in and out, without copies.

    ``spinning``: ORT's threads spin within a run (and park when it ends). ``threads``: ORT
    intra-op threads on CPU (None: PyTorch's count; ``session_options`` overrides both).
    ``initializers``: the tensors behind the model's external initializers. ``park``: a
    multi-threaded CPU run parks PyTorch's busy-waiting workers (with ``park_torch_threads``;
    off for regions too short to gain from it, see :data:`~.threads.PARK_REGION_FLOPS`).

    With TensorRT and a model with symbolic dims, the session is made at the first call, with
    a shape profile built around that call's sizes (:func:`~.tensorrt.profile_for`); a later
    call outside the profile first gets a session with a wider one. Should that one fail to
    build, calls outside the profile run in PyTorch (:class:`OrtInputError`) and the others
    keep the session they have.
    """

    def __init__(
        self,
        model: OrtModel,
        options: Options,
        device: torch.device,
        *,
        spinning: bool = False,
        threads: int | None = None,
        initializers: dict[str, torch.Tensor] | None = None,
        park: bool = True,
    ) -> None:
        self.model = model
        self.options = options
        self.device = device
        self.spinning = spinning
        self.threads = threads
        #: the tensors behind the model's external initializers (the session reads their memory)
        self.initializers = dict(initializers or {})
        if device.type not in ORT_DEVICES:
            raise OrtRunError(f"no ORT execution provider reads tensors on device {device.type!r}")
        devkey = _device_key(device)
        stream = None
        if device.type == "cuda":
            stream = torch.cuda.current_stream(devkey[1]).cuda_stream
        # a region's own thread count applies to CPU sessions; others follow PyTorch's
        threads = threads if threads is not None and device.type == "cpu" else torch.get_num_threads()
        # a session holds shared initializers' memory (and prepacked copies of it): one per
        # version of each tensor
        shared = tuple((n, t.data_ptr(), t._version) for n, t in sorted((initializers or {}).items()))
        tf32 = cuda_tf32() if device.type == "cuda" else None
        # the session cache key, less the TensorRT profile
        self._base_key = (model.digest, options.key(), devkey, stream, tf32, spinning, threads, shared)
        self._session_threads = threads
        self._local = threading.local()
        self._open_lock = threading.Lock()
        requested = options.resolve_providers(device)
        profiles = not eps.uses_device_api(options) and tensorrt.wants_profiles(tensorrt.usable_providers(requested), options)
        #: the inputs TensorRT's shape profiles describe (empty: no profiles)
        self._profiled = tensorrt.profiled_inputs(model.input_names, model.input_specs) if profiles else ()
        #: the TensorRT shape profile of the current session (None: none)
        self.profile: tensorrt.Profile | None = None
        # a wider profile failed to build: calls outside the current one run in PyTorch
        self._refused = False
        #: the ORT session (None until the first call where it waits for a shape profile)
        self.session: Any = None
        #: the providers the session has
        self.providers = tuple(requested)
        #: how many of the model's nodes each execution provider runs (None: ORT cannot say)
        self.ep_nodes: dict[str, int] | None = None
        #: the session's entry in the session cache
        self.cache_key: Hashable = None
        self._sess: Any = None
        if not self._profiled:
            self._open(None)
        self._ort_device = _ort.c_device(*devkey)
        self._cpu_device = _ort.c_device("cpu", 0)
        self._torch_device = torch.device(*devkey) if devkey[0] == "cuda" else torch.device("cpu")
        self._run_options = onnxruntime().RunOptions()
        #: the CUDA stream the session runs on (None on CPU)
        self._stream = stream
        # binding plans worked out once: (name, spec, ORT element type); None type = ORT allocates
        self._input_plan = [(n, s, NUMPY_TYPES.get(s.dtype)) for n, s in zip(model.input_names, model.input_specs)]
        # outputs with symbolic dims the inputs' sizes give are allocated by torch as well;
        # ORT allocates the others (dims it alone knows)
        self._symbol_at, shapes = _output_shapes(model)
        self._output_plan = [
            (n, s, NUMPY_TYPES.get(s.dtype) if s.static or shape is not None else None, shape)
            for n, s, shape in zip(model.output_names, model.output_specs, shapes)
        ]
        self._shaped_outputs = any(shape is not None for shape in shapes)
        self._dynamic_outputs = any(t is None for _, _, t, _ in self._output_plan)
        self._checks = model.checks
        if stream is not None and not self._dynamic_outputs:
            # Every output is a torch tensor ORT writes on the stream torch orders its work on,
            # so the run needs no wait for the GPU at its end (ORT's default), and the caller's
            # next ops queue behind it. Outputs ORT allocates itself keep the wait: its arena
            # is not ordered by torch's stream.
            self._run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self._tick = metrics.ticker("ort_runs")
        # a multi-threaded CPU run parks PyTorch's idle OpenMP workers (threads.parking)
        ort_threads = int(options.session_options.get("intra_op_num_threads", threads) or 0)  # 0: ORT's default
        self._parked = None
        if device.type == "cpu" and options.park_torch_threads and park and ort_threads != 1:
            self._parked = parking()
        self._tick_parked = metrics.ticker("parked_runs")

    def _open(self, profile: tensorrt.Profile | None) -> None:
        """Make (or take from the session cache) the session with TensorRT shape ``profile``."""
        key = (*self._base_key, profile)
        cache = session_cache(self.options.cache_size)
        initializers = self.initializers or None

        def create() -> tuple[Any, tuple[str, ...], dict[str, int] | None]:
            made = create_session(self.model, self.options, self.device, self.spinning, self._session_threads, initializers, profile)
            # the session reads (and prepacked copies of) these tensors' memory: it must not
            # serve a later tensor that gets the same address
            cache.drop_with(key, (initializers or {}).values())
            return made

        session, providers, nodes = cache.get_or_create(key, create)
        self.session, self.providers, self.ep_nodes, self.cache_key = session, providers, nodes, key
        self.profile = profile
        self._sess = _ort.raw_session(session)
        if tensorrt.TRT not in providers:  # made without TensorRT (it cannot load here)
            self._profiled = ()

    def _fit_profile(self, inputs: Sequence[Any]) -> None:
        """Make sure the session's TensorRT profile covers these inputs' shapes: the first call
        opens the session, a call past the profile opens one with a wider profile.

        Raises:
            OrtInputError: these shapes are outside a profile that could not be widened.
            OrtRunError: the first session could not be made.
        """
        shapes = tensorrt.call_shapes(self._profiled, inputs)
        profile = self.profile
        if profile is not None and profile.covers(shapes):
            return
        with self._open_lock:
            profile = self.profile
            if profile is not None and profile.covers(shapes):
                return
            if self._refused:
                raise OrtInputError(
                    f"{self.model.name}: shapes {shapes} are outside its TensorRT profile ({profile.describe()})"
                )
            wider = tensorrt.profile_for(self._profiled, shapes, self.options.trt_profile_scale, profile)
            if profile is None:
                self._open(wider)
                return
            old_key = self.cache_key
            try:
                self._open(wider)
            except OrtRunError as e:
                self._refused = True
                raise OrtInputError(
                    f"{self.model.name}: no TensorRT profile for shapes {shapes} ({e}); such calls run in PyTorch"
                ) from None
            session_cache().discard(old_key)  # the wider profile serves every call the old one did
            metrics.increment("trt_profile_rebuilds")
            logger.info("ort-lazy: %s: TensorRT profile widened to %s", self.model.name, wider.describe())

    def tensor_call(self) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None:
        """A leaner :meth:`run` for callers that pass exactly the model's inputs as host tensors
        of its dtypes and ints for its integer scalars (checked by the caller): every input
        bound, every output a torch tensor bound by pointer, the run, nothing else per call.
        None where the model needs more: a GPU session, other scalar inputs, outputs only ORT
        can size, check outputs, a TensorRT shape profile still to fit (its session is made at
        the first call and replaced by one with a wider profile when a call is past it: only
        :meth:`run` fits the profile first, and the lean call keeps the session it was made for).

        The call raises :class:`OrtRunError` when binding or running fails.
        """
        if self.device.type != "cpu" or self._dynamic_outputs or self._checks or self._profiled or self._sess is None:
            return None
        if any(t is None or (spec.scalar and spec.dtype != torch.int64) for _, spec, t in self._input_plan):
            return None
        # ONNX element types as ints: ORT reads them without converting a numpy type (~1 us a binding)
        inputs = [(i, name, TORCH_TO_ONNX[spec.dtype], spec.scalar) for i, (name, spec, _) in enumerate(self._input_plan)]
        scalar = torch.tensor
        outputs = [
            (name, spec.dtype, TORCH_TO_ONNX[spec.dtype], spec.shape if shape is None else None, shape)
            for name, spec, _, shape in self._output_plan
        ]
        symbol_at = list(self._symbol_at.items())
        cpu = self._cpu_device
        # no profile to fit: the session stays, so each thread's binding (binding_of) is one of it
        run = self._sess.run_with_iobinding
        run_options = self._run_options
        parked = self._parked
        tick, tick_parked = self._tick, self._tick_parked
        empty = torch.empty
        binding_of = self._binding

        local = self._local

        def call(values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            binding = binding_of()
            bound = local.bound
            try:
                keep = []  # contiguous copies, alive until the run ends
                for (i, name, element_type, is_size), value in zip(inputs, values):
                    if is_size:  # an int: a 0-d int64 tensor
                        value = scalar(value, dtype=torch.int64)
                        keep.append(value)
                        binding.bind_input(name, cpu, element_type, (), value.data_ptr())
                        continue
                    if not value.is_contiguous():
                        value = value.contiguous()
                        keep.append(value)
                        bound[i] = None
                    ptr = value.data_ptr() if value.numel() else _data_ptr(value)
                    state = bound[i]
                    # the tensor bound last call (same object, memory and shape): nothing to bind
                    if state is not None and state[0] == id(value) and state[1] == ptr and state[2] == value.shape:
                        continue
                    binding.bind_input(name, cpu, element_type, value.shape, ptr)
                    bound[i] = (id(value), ptr, value.shape, value.dtype) if value is values[i] else None
                symbols = {s: values[i].shape[d] for s, (i, d) in symbol_at} if symbol_at else None
                results = []
                for name, dtype, element_type, static, shape in outputs:
                    dims = static if shape is None else shape(symbols)
                    out = empty(dims, dtype=dtype)
                    binding.bind_output(name, cpu, element_type, dims, out.data_ptr() if out.numel() else _data_ptr(out))
                    results.append(out)
                if parked is None:
                    run(binding, run_options)
                elif parked(run, binding, run_options):
                    tick_parked()
            except Exception as e:
                self._reset(binding)
                raise OrtRunError(f"ORT run failed for {self.model.name}: {e}") from e
            tick()
            return results

        return call

    def _binding(self) -> Any:
        """This thread's IOBinding, of the session in ``self._local.sess`` (a new one after the
        session changed: a wider TensorRT profile; a run in another thread keeps the old one)."""
        local = self._local
        b = getattr(local, "binding", None)
        sess = self._sess
        if b is None or local.sess is not sess:
            b = _ort.new_binding(sess)
            local.binding, local.sess = b, sess
            # what each input slot is bound to: (data pointer, shape, dtype, device)
            local.bound = [None] * len(self._input_plan)
        return b

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """Run the model; ``inputs`` are tensors or Python numbers, in graph input order.

        Raises:
            OrtRunError: binding or running failed (the caller falls back to PyTorch).
        """
        if self._profiled:
            try:
                self._fit_profile(inputs)
            except OrtRunError:
                raise
            except Exception as e:
                raise OrtRunError(f"ORT session failed for {self.model.name}: {e}") from e
        binding = self._binding()
        try:
            return self._run(binding, inputs)
        except OrtRunError:
            self._reset(binding)
            raise
        except Exception as e:
            self._reset(binding)
            raise OrtRunError(f"ORT run failed for {self.model.name}: {e}") from e

    def _run_cuda(self, binding: Any, sess: Any) -> None:
        """Run on the session's stream, ordered after the caller's current stream's work.

        A session is bound to the stream that was current when it was created; called under
        another stream (``with torch.cuda.stream(s)``), ORT's stream first waits for the
        caller's (which produced the inputs), and the caller's then waits for ORT's (which
        writes the outputs), so neither side reads memory the other has not finished with.
        """
        current = torch.cuda.current_stream(self._torch_device)
        if current.cuda_stream == self._stream:
            sess.run_with_iobinding(binding, self._run_options)
            return
        if self._stream == 0:
            own = torch.cuda.default_stream(self._torch_device)
        else:
            own = torch.cuda.ExternalStream(self._stream, device=self._torch_device)
        own.wait_stream(current)
        sess.run_with_iobinding(binding, self._run_options)
        current.wait_stream(own)
        metrics.increment("stream_handoffs")

    def _reset(self, binding: Any) -> None:
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        self._local.bound = [None] * len(self._input_plan)

    def _run(self, binding: Any, inputs: Sequence[Any]) -> list[torch.Tensor]:
        # Every call rebinds every input and output by name, so earlier bindings are never
        # read again and need no clearing on the hot path.
        sess = self._local.sess  # the session ``binding`` belongs to
        keep: list[torch.Tensor] = []  # converted inputs, alive until the run ends
        bound = self._local.bound
        for i, ((name, spec, element_type), value) in enumerate(zip(self._input_plan, inputs)):
            state = bound[i]
            if state is not None and state[0] == id(value):
                # the tensor bound last call (a weight): same memory, shape, type and layout
                # is an identical binding (no reference is kept, so the id is checked with all
                # of them)
                if (value.data_ptr() == state[1] and value.shape == state[2] and value.dtype is state[3]
                        and value.is_contiguous()):
                    continue
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value, dtype=spec.dtype)
                keep.append(value)
            elif not value.is_contiguous():
                value = value.contiguous()
                keep.append(value)
            if value.is_cuda:
                if value.device != self._torch_device:
                    raise OrtInputError(
                        f"input {name!r} is on {value.device}, {self.model.name} runs on {self._torch_device}"
                    )
                dev = self._ort_device
            elif value.is_cpu:
                dev = self._cpu_device
            else:
                # meta, mps, xpu ...: no data ORT could read; binding it would crash the process
                raise OrtInputError(f"input {name!r} is on device {value.device.type!r}, which ORT cannot read")
            ptr = value.data_ptr() if value.numel() else _data_ptr(value)
            if value.dtype is not spec.dtype:
                element_type = NUMPY_TYPES.get(value.dtype)
                if element_type is None:
                    raise OrtInputError(f"input {name!r} has dtype {value.dtype}, which ORT cannot carry")
            binding.bind_input(name, dev, element_type, value.shape, ptr)
            bound[i] = (id(value), ptr, value.shape, value.dtype) if value is inputs[i] else None
        outputs: list[torch.Tensor | None] = []
        symbols = {s: inputs[i].shape[d] for s, (i, d) in self._symbol_at.items()} if self._shaped_outputs else None
        for name, spec, element_type, shape in self._output_plan:
            if element_type is None:
                binding.bind_output(name, self._ort_device)
                outputs.append(None)
                continue
            dims = spec.shape if shape is None else shape(symbols)
            out = torch.empty(dims, dtype=spec.dtype, device=self.device)
            binding.bind_output(name, self._ort_device, element_type, dims, out.data_ptr() if out.numel() else _data_ptr(out))
            outputs.append(out)
        if self._parked is not None:
            if self._parked(sess.run_with_iobinding, binding, self._run_options):
                self._tick_parked()
        elif self._stream is not None:
            self._run_cuda(binding, sess)
        else:
            sess.run_with_iobinding(binding, self._run_options)
        if self._dynamic_outputs:
            ort_values = binding.get_outputs()
            dims = _symbol_values(self.model.input_specs, inputs)
            for i, o in enumerate(outputs):
                if o is None:
                    spec = self.model.output_specs[i]
                    outputs[i] = _checked(_from_ortvalue(ort_values[i], spec.dtype), spec, dims)
        if self._checks:
            flags = outputs[-self._checks :]
            del outputs[-self._checks :]
            if any(bool(flag) for flag in flags):
                metrics.increment("check_fallbacks")
                raise OrtCheckError(
                    f"{self.model.name} took a fast form these inputs need the exact one of (a max pooling "
                    "input holds a NaN, which ORT's MaxPool skips and eager passes on)"
                )
        self._tick()
        return outputs  # type: ignore[return-value]


def _output_shapes(
    model: OrtModel,
) -> tuple[dict[str, tuple[int, int]], list[Callable[[dict[str, int]], list[int]] | None]]:
    """Where each symbol of ``model``'s input specs is first read (input, dim: a tensor dim
    that is the symbol itself), and per output a function of those symbols' values giving its
    shape: None for a static output, and for one a dim of which no input's size gives (ORT
    allocates that one: only it knows the size)."""
    symbol_at: dict[str, tuple[int, int]] = {}
    for i, spec in enumerate(model.input_specs):
        if spec.scalar:
            continue
        for d, dim in enumerate(spec.shape):
            if isinstance(dim, str) and dim.isidentifier() and dim not in symbol_at:
                symbol_at[dim] = (i, d)
    shapes: list[Callable[[dict[str, int]], list[int]] | None] = []
    for spec in model.output_specs:
        if spec.static or NUMPY_TYPES.get(spec.dtype) is None:
            shapes.append(None)
            continue
        try:
            needed = set().union(*(dim_symbols(d) for d in spec.shape if isinstance(d, str)))
            dims = [parse_dim(d) if isinstance(d, str) else d for d in spec.shape]
        except ValueError:
            shapes.append(None)
            continue
        if not needed <= set(symbol_at):
            shapes.append(None)
            continue
        shapes.append(lambda symbols, dims=dims: [d(symbols) if callable(d) else d for d in dims])
    used = set().union(*(dim_symbols(d) for s, f in zip(model.output_specs, shapes) if f is not None for d in s.shape if isinstance(d, str)))
    return {s: at for s, at in symbol_at.items() if s in used}, shapes


_PLACEHOLDERS: dict[torch.device, torch.Tensor] = {}


def _data_ptr(t: torch.Tensor) -> int:
    """The tensor's data pointer; a valid dummy one for empty tensors (ORT rejects null)."""
    if t.numel():
        return t.data_ptr()
    dummy = _PLACEHOLDERS.get(t.device)
    if dummy is None:
        dummy = _PLACEHOLDERS.setdefault(t.device, torch.empty(16, dtype=torch.uint8, device=t.device))
    return dummy.data_ptr()


def _symbol_values(specs: Sequence[TensorSpec], inputs: Sequence[torch.Tensor]) -> dict[int | str, int]:
    """Values of the symbolic dims (``s0`` ...) as bound by this call's inputs."""
    values: dict[int | str, int] = {}
    for spec, value in zip(specs, inputs):
        for d, n in zip(spec.shape, getattr(value, "shape", ())):
            if isinstance(d, str):
                values[d] = n
    return values


def _checked(out: torch.Tensor, spec: TensorSpec, dims: dict[int | str, int]) -> torch.Tensor:
    """Reject an ORT output whose rank or known dims differ from the graph's (never return it)."""
    if out.dim() != len(spec.shape) or any(
        (d if isinstance(d, int) else dims.get(d, n)) != n for d, n in zip(spec.shape, out.shape)
    ):
        raise OrtRunError(f"ORT returned shape {tuple(out.shape)}, the graph expects {spec.shape}")
    return out


def _from_ortvalue(value: Any, dtype: torch.dtype) -> torch.Tensor:
    """An ORT-allocated output as a torch tensor sharing its memory (DLPack)."""
    out = torch.from_dlpack(value.to_dlpack())
    if out.dtype != dtype:  # defensive: never hand back a silently different dtype
        raise OrtRunError(f"ORT returned {out.dtype}, the graph expects {dtype}")
    return out

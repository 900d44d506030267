"""Running an ORT model from torch: :class:`OrtRunner`, zero-copy runs through IOBinding.

Inputs are bound by data pointer (no copy unless a tensor is non-contiguous); outputs are
torch tensors allocated up front and bound by pointer when their shapes are static, otherwise
ORT allocates them and they cross to torch through DLPack. Either way no output is copied.

The runner's sessions are made by :mod:`~ort_lazy.runtime.session_create` and kept by
:mod:`~ort_lazy.runtime.session_cache`; :mod:`~ort_lazy.runtime.iobinding` plans its bindings
(element types, output shapes, DLPack). Their public names are importable from here as well.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .. import metrics
from ..options import Options
from ..specs import TORCH_TO_ONNX, OrtModel
from . import _ort, tensorrt
from . import providers as eps
from .flavour import onnxruntime
from .iobinding import (
    NUMPY_TYPES,
    ORT_DEVICES,
    _checked,
    _data_ptr,
    _from_ortvalue,
    _output_shapes,
    _symbol_values,
)
from .session_cache import SessionCache, session_cache
from .session_create import (
    CUDA_STREAM_LEGACY,
    OrtCheckError,
    OrtInputError,
    OrtRunError,
    create_session,
    cuda_tf32,
    ort_stream_handle,
    provider_options_for,
)
from .threads import parking

__all__ = [
    "SessionCache",
    "session_cache",
    "create_session",
    "OrtRunner",
    "OrtRunError",
    "OrtInputError",
    "OrtCheckError",
    "NUMPY_TYPES",
    "ORT_DEVICES",
    "provider_options_for",
    "ort_stream_handle",
    "cuda_tf32",
    "CUDA_STREAM_LEGACY",
]

logger = logging.getLogger("ort_lazy")


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

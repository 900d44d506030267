"""Making ORT sessions: session options, each provider's options (device, torch's stream, TF32,
TensorRT's caches and shape profile), the IR-version clamp, and the errors sessions and runs raise.

:func:`create_session` makes one session and caches nothing:
:mod:`~ort_lazy.runtime.session_cache` keeps sessions, :class:`~ort_lazy.runtime.session.OrtRunner`
runs them.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .. import metrics
from ..debug.nvtx import nvtx_range
from ..options import Options, OptionsError, apply_session_options
from ..specs import OrtModel
from . import _ort, tensorrt
from . import providers as eps
from .flavour import max_ir_version, onnxruntime
from .kernel_fixes import KERNEL_FIXES_FACT, kernel_fixes
from .quirks import (
    EXACT_SIGMOID_FACT,
    MATMUL_TRANSPOSES_FACT,
    disabled_optimizers,
    exact_sigmoid,
    fuse_matmul_transposes,
    model_vector_matmul,
)

__all__ = [
    "OrtRunError",
    "OrtInputError",
    "OrtCheckError",
    "create_session",
    "provider_options_for",
    "ort_stream_handle",
    "cuda_tf32",
    "CUDA_STREAM_LEGACY",
]


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
            # the installed onnxruntime's kernel bugs: rewritten around at export, else here
            if not model.facts.get(KERNEL_FIXES_FACT):
                exact = kernel_fixes(exact, providers)
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

"""Every private torch API ort-lazy uses, in one place, guarded by torch version.

Nothing public translates an aten FX graph to ONNX in milliseconds while keeping symbolic
dims, so the exporter's internals are used here. Supported torch versions are listed in
``SUPPORTED_TORCH``; on another version the imports are attempted and a clear error names
what moved.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "static_int",
    "SUPPORTED_TORCH",
    "torch_version",
    "supported_torch_range",
    "unsupported_torch_message",
    "check_torch_version",
    "is_fake_tensor",
    "onnx_registry",
    "onnx_implemented_overloads",
    "translate_fx_graph",
    "cached_op_signatures",
    "insert_type_promotion",
    "new_ir_model",
    "finalize_ir_model",
    "graph_break_counts",
    "graph_break_of",
    "returned_in_traced_layout",
]

#: (major, minor) torch versions, oldest first and consecutive, whose private APIs (this
#: module's, and the C++ ones cpp/bridge.cpp calls) were checked against their sources: the one
#: source of the supported range that pyproject.toml, the README, the conda recipe and CI's
#: matrix declare (tests/test_packaging.py checks that they agree with it).
SUPPORTED_TORCH = ((2, 13), (2, 14))


_EXPORTER_LOGGERS = (
    "torch.onnx._internal.exporter._core",
    "torch.onnx._internal.exporter._registration",
    "torch.onnx._internal.exporter._building",
    "torch.onnx._internal.fx.passes.type_promotion",
)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporter's per-node chatter (missing module stacks, torchvision ops)."""
    loggers = [logging.getLogger(n) for n in _EXPORTER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def real_tensor_mode() -> Any:
    """A context in which tensor ops run for real even inside AOTAutograd's fake-tensor tracing."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def aot_autograd(**kwargs: Any) -> Any:
    """torch's AOTAutograd dynamo backend factory (forward/backward/inference compilers)."""
    from torch._dynamo.backends.common import aot_autograd as _aot

    return _aot(**kwargs)


def default_partition() -> Any:
    """AOTAutograd's default partition function (saves what the backward reads, recomputes nothing)."""
    from torch._functorch.partitioners import default_partition as _partition

    return _partition


def joint_forward_nodes(joint: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes of an AOTAutograd joint graph that :func:`default_partition` puts in the
    forward: every node but the tangents up to the last primal or forward-tagged node."""
    from torch._functorch._aot_autograd.utils import _is_fwd_seed_offset, _is_primal, _is_tangent
    from torch._functorch.partitioners import _has_tag_is_forward

    nodes = list(joint.graph.nodes)
    last = max((i for i, n in enumerate(nodes) if _has_tag_is_forward(n) or _is_primal(n) or _is_fwd_seed_offset(n)), default=-1)
    return {n for n in nodes[: last + 1] if not _is_tangent(n) and n.op != "output"}


#: AOTAutograd's output descriptors (``output.meta["desc"]``) of the values a compiled graph
#: gives its caller in the layout eager gave them: the user's outputs, and the bases from which
#: AOTAutograd regenerates outputs that are views of intermediates
_LAID_OUT_AS_TRACED = ("PlainAOTOutput", "IntermediateBaseAOTOutput")


def returned_in_traced_layout(output: torch.fx.Node) -> list[bool] | None:
    """For each value an AOTAutograd graph's ``output`` node returns, whether its caller reads
    it in the layout it was traced with (AOTAutograd's output descriptors, torch >= 2.9; not
    the tensors saved for backward, input mutations, RNG offsets or tokens); None where the
    graph carries no descriptors (graphs AOTAutograd did not make)."""
    descs = output.meta.get("desc")
    returned = output.args[0] if output.args else None
    if not isinstance(descs, (list, tuple)) or not isinstance(returned, (list, tuple)) or len(descs) != len(returned):
        return None
    return [type(d).__name__ in _LAID_OUT_AS_TRACED for d in descs]


def dynamo_control_exceptions() -> tuple[type[BaseException], ...]:
    """Exceptions dynamo raises through a backend to steer its own tracing (restart the
    analysis, skip the frame): a backend must let them pass, never treat them as failures."""
    from torch._dynamo import exc

    names = ("TensorifyScalarRestartAnalysis", "ShortenTraceback", "SkipFrame", "RestartAnalysis")
    return tuple(getattr(exc, n) for n in names if isinstance(getattr(exc, n, None), type))


@functools.cache
def body_calling_ops() -> frozenset[Any]:
    """Higher-order ops whose eager implementation calls their graph arguments on plain tensors
    (``torch.cond``'s branches, ``while_loop``'s functions, ``map``'s body, ``scan``'s combine
    function, a nested compile region's body): those graphs can be lowered like any graph.
    Others (``flex_attention``'s score and mask functions, ``associative_scan``'s combine
    function) are called under function transforms, on tensors without storage, and are left
    alone."""
    from torch._ops import HigherOrderOperator

    ops = (getattr(torch.ops.higher_order, n, None) for n in ("cond", "while_loop", "map_impl", "scan", "invoke_subgraph"))
    return frozenset(op for op in ops if isinstance(op, HigherOrderOperator))


def on_dynamo_frame_compiled(callback: Any) -> None:
    """Call ``callback()`` each time dynamo finishes converting a Python frame (any backend)."""
    torch._dynamo.callback_handler.register_end_callback(lambda _args: callback())


def frame_being_compiled() -> tuple[dict[str, Any], Any] | None:
    """From inside a dynamo compile callback: (the local variables of the Python frame dynamo is
    converting, the backend it compiles with), or None when they cannot be found."""
    import sys

    f = sys._getframe(1)
    for _ in range(64):
        if f is None:
            return None
        if f.f_code.co_name == "_compile" and f.f_code.co_filename.endswith("convert_frame.py"):
            frame = f.f_locals.get("frame")
            frame_locals = getattr(frame, "f_locals", None)
            if not isinstance(frame_locals, dict):
                return None
            return frame_locals, f.f_locals.get("compiler_fn")
        f = f.f_back
    return None


def unwrap_backend(fn: Any) -> Any:
    """The user's backend callable inside dynamo's and torch.compile's wrappers."""
    import functools

    for _ in range(8):
        inner = getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None)
        if inner is None and isinstance(fn, functools.partial):
            inner = fn.func
        if inner is None or inner is fn:
            return fn
        fn = inner
    return fn


def dynamo_skips(code: Any) -> bool:
    """Whether dynamo refuses to trace ``code`` as a frame of its own (torch's own modules)."""
    from torch._dynamo import trace_rules

    return bool(trace_rules.check(code))


def graph_break_counts() -> dict[str, dict[str, int]]:
    """Dynamo's counts so far in this process, per reason: ``graph_break`` (dynamo split the
    frame there) and ``unimplemented`` (it gave up on the whole frame, which runs in Python);
    empty when this torch keeps none."""
    try:
        from torch._dynamo.utils import counters

        return {
            category: {str(k): int(v) for k, v in counters[category].items()}
            for category in ("graph_break", "unimplemented")
        }
    except Exception:
        return {}


def graph_break_of(gm: torch.fx.GraphModule) -> tuple[str, str | None, int | None] | None:
    """``(reason, file, line)`` of the graph break that ended the dynamo graph ``gm`` (the code
    there runs in Python), or None when ``gm`` did not end at a graph break."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    stack = list(getattr(reason, "user_stack", None) or [])
    frame = stack[-1] if stack else None
    return str(getattr(reason, "reason", "")), getattr(frame, "filename", None), getattr(frame, "lineno", None)


def module_state_positions(gm: torch.fx.GraphModule) -> set[int]:
    """Placeholder positions of a dynamo graph that hold a module's parameter or buffer.

    Read from the source dynamo records for each graph input (``L['self']._modules['bn']
    ._buffers['running_mean']``); empty when the graph carries no sources (not from dynamo).
    """
    found: set[int] = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        try:
            name = source.name  # a cached property on torch 2.13, a method on older versions
            name = name() if callable(name) else name
        except Exception:
            continue
        if isinstance(name, str) and ("._parameters[" in name or "._buffers[" in name):
            found.add(i)
    return found


def tracing_context(fake_mode: Any) -> Any:
    """A tracing context whose fake mode is ``fake_mode`` (passes look the mode up there)."""
    from torch._guards import TracingContext, tracing

    return tracing(TracingContext(fake_mode))


def functionalize(fn: Any) -> Any:
    """``fn`` traced without mutations: ops that write in place become their functional forms;
    a write into an input is kept as one ``copy_`` into that input at the end.

    Like ``torch.func.functionalize(fn, remove="mutations")``, but through the Python
    functionalization AOTAutograd uses, which keeps symbolic sizes symbolic: the C++ wrapper
    of ``torch.func.functionalize`` reads concrete sizes in composite ops (``linear`` of a 3-d
    input), which specializes the dims they touch and makes dynamo recompile per shape.
    Raises ``NotImplementedError`` for inputs it does not handle (tensor subclasses, a change
    of an input's shape, strides or storage).
    """
    from torch._functorch._aot_autograd.functional_utils import from_fun, to_fun
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    def run(*args: Any) -> Any:
        if any(isinstance(a, torch.Tensor) and is_traceable_wrapper_subclass(a) for a in args):
            raise NotImplementedError("tensor subclass input")
        exclude = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
        with exclude, FunctionalTensorMode():
            wrapped = [to_fun(a) for a in args]
            outputs = fn(*wrapped)
            outputs = torch.utils._pytree.tree_map_only(FunctionalTensor, from_fun, outputs)
            written = []
            for arg, value in zip(args, wrapped):
                if not isinstance(value, FunctionalTensor):
                    continue
                torch._sync(value)
                if torch._functionalize_has_metadata_mutation(value.elem) or torch._functionalize_was_storage_changed(
                    value.elem
                ):
                    raise NotImplementedError("an input's shape, strides or storage change")
                if torch._functionalize_has_data_mutation(value.elem):
                    written.append((arg, from_fun(value)))
        for arg, value in written:
            arg.copy_(value)
        return outputs

    return run


def fused_multiply_add() -> Any:
    """The ``prims.fma`` op dynamo writes for ``addcmul_``/``addcdiv_`` with a ``value`` and
    ``add_`` with a tensor ``alpha`` (defined by Inductor's prims); None where torch has none."""
    try:
        from torch._inductor import inductor_prims
    except ImportError:
        return None
    op = getattr(inductor_prims, "fma", None)
    return getattr(op, "default", op) if op is not None else None


def python_dispatcher(fake_mode: Any) -> contextlib.AbstractContextManager[Any]:
    """The Python dispatcher while tracing with a fake mode that has a shape environment, as
    AOTAutograd traces: composite ops then decompose through their Python implementations,
    which take symbolic sizes (the C++ kernels some of them reach want concrete integers and
    fail: the decomposition of MobileNet's in-place activations broadcasts through ``expand``)."""
    if getattr(fake_mode, "shape_env", None) is None:
        return contextlib.nullcontext()
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def static_int(value: Any) -> int | None:
    """``value`` as an int when it is one or a symbolic int whose expression is a number
    (``0 * s0``, the element count of an empty batch under dynamic shapes); None otherwise."""
    if isinstance(value, int):
        return value
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    return int(value) if isinstance(value, torch.SymInt) and is_concrete_int(value) else None


def size_hint(value: Any) -> int | None:
    """An int, or a symbolic int's value as the shape environment last saw it, for estimates
    (no guard is added: the graph stays valid for every size); None when there is none."""
    if isinstance(value, int):
        return value
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:  # torch without it: no estimate
        return None
    try:
        return int(optimization_hint(value))
    except Exception:  # an unbacked symbol with no hint
        return None


def dense_layout(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its memory without gaps or overlaps (any dim order)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return bool(is_non_overlapping_and_dense_or_false(t))


def memory_format_of(t: torch.Tensor) -> torch.memory_format:
    """The memory format PyTorch's kernels give a new tensor computed from ``t`` (channels-last
    for a channels-last input, else contiguous)."""
    from torch._prims_common import suggest_memory_format

    return suggest_memory_format(t)


def is_fake_tensor(value: Any) -> bool:
    """Whether ``value`` is a fake tensor (metadata only, no storage to read).

    torch 2.14 added ``is_fake_tensor``, true for a Python ``FakeTensor`` and for the C++ fake
    tensors it introduces, which are no ``FakeTensor`` instances; before 2.14 the Python class is
    the only kind.
    """
    from torch._subclasses import fake_tensor

    check = getattr(fake_tensor, "is_fake_tensor", None)
    if check is not None:  # torch >= 2.14
        return bool(check(value))
    return isinstance(value, fake_tensor.FakeTensor)


def new_fake_mode() -> Any:
    """A fresh FakeTensorMode (meta-only tensors carrying dtype/shape/device)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def function_from_graph(name: str, graph: Any) -> Any:
    """A callable TorchScript function running ``graph``."""
    return torch._C._create_function_from_graph(name, graph)


@contextlib.contextmanager
def torchscript_exporter_log_kept() -> Iterator[None]:
    """Keep the TorchScript exporter from switching on TorchScript's ONNX log.

    Its ``setup_onnx_logging`` (torch 2.13 and 2.14) tests the log-state *function* rather
    than its result, so every export turns the log on for good and a failed export prints
    its whole graph ("Torch IR graph at exception") to stdout. During the block the exporter
    gets a version that honours the setting the process had (on only if it was on).
    """
    try:
        from torch.onnx._internal.torchscript_exporter import utils
    except ImportError:  # a torch without that module: nothing to keep
        yield
        return
    if not hasattr(utils, "setup_onnx_logging"):
        yield
        return

    @contextlib.contextmanager
    def setting_kept(verbose: bool) -> Iterator[None]:
        was = torch._C._jit_is_onnx_log_enabled()
        torch._C._jit_set_onnx_log_enabled(was or bool(verbose))
        try:
            yield
        finally:
            torch._C._jit_set_onnx_log_enabled(was)

    original = utils.setup_onnx_logging
    utils.setup_onnx_logging = setting_kept
    try:
        yield
    finally:
        utils.setup_onnx_logging = original


def init_lazy_ts_backend() -> None:
    """Initialise LazyTensor's TorchScript backend."""
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()


def lazy_backend_registered() -> bool:
    """Whether a LazyTensor backend is registered in this process."""
    try:
        torch._C._lazy._get_default_device_type()
        return True
    except RuntimeError:
        return False


def transformer_encoder_fast_path() -> Any:
    """The fused TransformerEncoderLayer fast-path function dynamo records, if this torch has it."""
    return getattr(torch, "_transformer_encoder_layer_fwd", None)


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``version`` (a torch version string, ``2.14.1+cu130``), by default of
    the running torch."""
    text = torch.__version__ if version is None else version
    major, minor = str(text).split("+")[0].split(".")[:2]
    return int(major), int(minor)


def supported_torch_range() -> tuple[str, str]:
    """The supported torch versions as a pip range's bounds: ``(">=2.13", "<2.15")``."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TORCH[0], SUPPORTED_TORCH[-1]
    return f">={low_major}.{low_minor}", f"<{high_major}.{high_minor + 1}"


def _supported_list() -> str:
    return ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_TORCH)


def unsupported_torch_message(version: str | None = None) -> str | None:
    """Why torch ``version`` (by default the running one) is outside :data:`SUPPORTED_TORCH`,
    or None when it is one of them."""
    text = torch.__version__ if version is None else version
    found = torch_version(text)
    if found in SUPPORTED_TORCH:
        return None
    if found < SUPPORTED_TORCH[0]:
        return f"torch {text} is older than ort-lazy supports (torch {_supported_list()}); it does not run on it"
    return (
        f"torch {text} is newer than the versions ort-lazy was checked against (torch {_supported_list()}): "
        "the private torch APIs it uses may have changed there, so a failure may come from ort-lazy "
        "rather than the model"
    )


class UnsupportedTorchError(RuntimeError):
    """The running torch lacks a private API ort-lazy depends on."""


class UnsupportedTorchWarning(UserWarning):
    """The running torch is newer than every version ort-lazy was checked against."""


#: whether check_torch_version has warned of a newer torch in this process
_warned_newer = False


def check_torch_version() -> None:
    """Raise :class:`UnsupportedTorchError` when torch is older than the oldest supported;
    warn (:class:`UnsupportedTorchWarning`, once per process) when it is newer than the newest."""
    global _warned_newer
    found = torch_version()
    if found in SUPPORTED_TORCH:
        return
    message = unsupported_torch_message()
    if found < SUPPORTED_TORCH[0]:
        raise UnsupportedTorchError(message)
    if not _warned_newer:
        _warned_newer = True
        warnings.warn(message, UnsupportedTorchWarning, stacklevel=2)


def _exporter() -> Any:
    check_torch_version()
    try:
        from torch.onnx._internal.exporter import (
            _constants,
            _core,
            _decomp,
            _fx_passes,
            _ir_passes,
            _registration,
        )
    except ImportError as e:  # pragma: no cover - depends on torch layout
        raise UnsupportedTorchError(
            f"torch {torch.__version__}: the ONNX exporter internals moved ({e}); "
            f"ort-lazy supports torch {_supported_list()}"
        ) from e
    return _constants, _core, _decomp, _fx_passes, _ir_passes, _registration


@functools.lru_cache(maxsize=1)
def onnx_registry() -> Any:
    """The exporter's aten -> ONNX registry built from torchlib (built once, ~1 s)."""
    _, _, _, _, _, _registration = _exporter()
    with quiet_exporter():
        return _registration.ONNXRegistry.from_torchlib()


def register_translation(registry: Any, op: Any, function: Any) -> None:
    """Add ``function`` (onnxscript-style, run by the translator) as ``op``'s translation."""
    with quiet_exporter():  # a translation taking numbers or tensors has no ONNX signature
        registry.register_op(op, function)


def library_translation(op: Any) -> Any:
    """The exporter's own translation of ``op`` (torchlib's), under any ort-lazy registered;
    None when it has none."""
    library = [d for d in onnx_registry().get_decomps(op) if not d.is_custom]
    return library[0].onnx_function if library else None


def current_translation_tracer() -> Any:
    """The exporter's tracer while it translates a node (None outside a translation)."""
    _, _core, _, _, _, _ = _exporter()
    return _core.current_tracer


def onnx_implemented_overloads() -> list[Any]:
    """Every aten overload the exporter's registry translates (builds the registry: seconds)."""
    _, _, _decomp, _, _, _ = _exporter()
    return list(_decomp.get_onnx_implemented_overloads(onnx_registry()))


def insert_type_promotion(gm: torch.fx.GraphModule) -> None:
    """Make implicit aten type promotion explicit (in place).

    The exporter's pass re-runs every node of the graph in fake mode to refresh its
    ``meta["val"]``; a node it does not change keeps the value it had (a promoted node's
    output is cast back to its old type, so what follows it is unchanged too), so here only
    the nodes it promotes or inserts are run and every other node's value is read from its
    ``meta``. Most nodes need no promotion; the pass runs once per region and once per op
    probed alone, so small graphs gain most (the ten 30-op mixed-dtype graphs of one
    ``tests/test_promotion.py`` case: 8.2 to 6.2 s; whole-model first calls: within noise). A
    node without a value, or with a real tensor for one, is run as the pass runs it.
    """
    _, _, _, _fx_passes, _, _ = _exporter()
    interpreter = _reusing_type_promotion()
    if interpreter is None:  # pragma: no cover - depends on torch layout
        _fx_passes.insert_type_promotion_nodes(gm)
        return
    from torch.onnx._internal.fx.passes import type_promotion

    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            raise TypeError(f"expected GraphModule, got {type(module)}")
        transform = type_promotion.InsertTypePromotion(module)
        transform.interpreter = interpreter(module, transform.interpreter.type_promotion_table)
        transform.interpreter.fake_mode = transform.fake_mode
        transform.run()


@functools.lru_cache(maxsize=1)
def _reusing_type_promotion() -> Any:
    """A subclass of the exporter's type promotion interpreter that runs only the nodes it
    promotes (see :func:`insert_type_promotion`); None when the pass's layout moved."""
    try:
        from torch.onnx._internal.fx.passes import type_promotion as tp

        base = tp._TypePromotionInterpreter
        rule_of = tp.get_type_promotion_rule
        if not all(hasattr(base, name) for name in ("_set_current_node", "_maybe_promote_node")):
            return None
    except (ImportError, AttributeError):  # pragma: no cover - depends on torch layout
        return None

    from torch._subclasses.fake_tensor import FakeTensor

    def reusable(val: Any, mode: Any) -> bool:
        # a value some pass wrote as a real tensor (a scalar_tensor's), or in another fake
        # mode, is run again, as the exporter's pass runs every node: such tensors cannot
        # meet the pass's own in one op
        values = val if isinstance(val, (tuple, list)) else (val,)
        return val is not None and all(
            not isinstance(v, torch.Tensor) or (isinstance(v, FakeTensor) and v.fake_mode is mode) for v in values
        )

    class Reusing(base):  # type: ignore[misc, valid-type]
        #: the fake mode the pass runs in (set by insert_type_promotion)
        fake_mode: Any = None

        def run_node(self, n: torch.fx.Node) -> Any:
            val = n.meta.get("val")
            if n.op != "call_function" or not reusable(val, self.fake_mode):
                return super().run_node(n)
            with self._set_current_node(n):
                rule = rule_of(n, self.type_promotion_table)
                if rule is None:
                    return val
                args, kwargs = n.args, n.kwargs
                self._maybe_promote_node(n, rule)
                changed = n.args != args or n.kwargs != kwargs
            return torch.fx.Interpreter.run_node(self, n) if changed else val

    return Reusing


def new_ir_model(name: str) -> Any:
    """An empty ONNX IR model the translator fills in."""
    import onnx_ir as ir

    _constants, _, _, _, _, _ = _exporter()
    return ir.Model(
        graph=ir.Graph([], [], nodes=[], name=name),
        ir_version=_constants.ONNX_IR_VERSION,
        producer_name="ort-lazy",
        producer_version=torch.__version__,
    )


#: op signatures by (domain, name, since_version), kept across translations
_SIGNATURES: dict[tuple[str, str, int], Any] = {}


@contextlib.contextmanager
def cached_op_signatures() -> Iterator[None]:
    """Within the block, ``onnx_ir``'s ``OpSignature.from_op_schema`` returns one signature per
    ONNX schema instead of building a new one each time.

    The exporter's translation calls it for every ONNX node it emits (``_building``'s
    ``OpRecorder.eval``), and building one walks the schema's inputs, attributes and type
    constraints: 7655 calls, 0.6 s of a ViT-Tiny training graph's 2.6 s export. Signatures are
    only read after they are made (onnxscript caches its functions' own the same way).
    """
    import onnx_ir as ir

    cls = ir.schemas.OpSignature
    original = cls.__dict__.get("from_op_schema")
    build = getattr(original, "__func__", None)
    if build is None:  # pragma: no cover - depends on onnx_ir's layout
        yield
        return

    def from_op_schema(klass: Any, schema: Any) -> Any:
        if klass is not cls:  # a subclass: its own signature type, not cached
            return build(klass, schema)
        key = (schema.domain, schema.name, schema.since_version)
        signature = _SIGNATURES.get(key)
        if signature is None:
            signature = _SIGNATURES[key] = build(klass, schema)
        return signature

    cls.from_op_schema = classmethod(from_op_schema)
    try:
        yield
    finally:
        cls.from_op_schema = original


def translate_fx_graph(graph: torch.fx.Graph, model: Any) -> dict[str, Any]:
    """Translate ``graph`` into ``model.graph`` (inputs, nodes and outputs)."""
    _, _core, _, _, _, _ = _exporter()
    registry = onnx_registry()
    with quiet_exporter(), cached_op_signatures():
        return _core._translate_fx_graph(
            graph,
            model,
            graph_like=model.graph,
            owned_graphs={},
            lower="at_conversion",
            registry=registry,
        )


def finalize_ir_model(model: Any) -> None:
    """Add the opset imports the translated nodes use."""
    _, _, _, _, _ir_passes, _ = _exporter()
    _ir_passes.add_opset_imports(model)

"""A captured graph (dynamo's, or any module's for ``ort_lazy.fx``) -> aten graphs -> ORT.

Training graphs go through AOTAutograd, which hands its forward and backward aten graphs to
:func:`ort_lazy.partition.compile_graph`. A graph dynamo captured with grad off only ever runs
without autograd (dynamo guards on grad mode), so it is lowered to aten directly (``make_fx``
under functionalization) and skips AOTAutograd's per-call wrappers.

Nothing here may break the user's model: any exception while lowering, partitioning or
exporting runs that graph in PyTorch (counted as ``compile_failures``, warned once, recorded
for ``explain``), unless the ``strict`` option asks for the exception. Compilation has no side
effect on the model: graphs are traced on fake tensors, rewrites work on copies, and a fallback
runs the graph as it was captured.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat, metrics
from ..debug.records import new_record, record_failure
from ..opnames import op_name
from ..options import Options
from ..partition import compile_graph
from ..reasons import Reason
from ..runtime.flavour import OrtUnavailableError
from ..runtime.region import OrtRegion
from .decompositions import decomposition_table
from .fast_paths import lower_fast_paths
from .fusions import fuse_activations
from .joint import partition, written_placeholders
from .layouts import storage_order_views
from .pooling import drop_unused_indices
from .simplify import simplify_aten

__all__ = ["compile_captured", "copy_graph_module", "lower_exported"]

logger = logging.getLogger("ort_lazy")


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule with its own copy of ``gm``'s graph (attributes and submodules shared)."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _failed(tag: str, error: BaseException, options: Options) -> None:
    """Count, warn once and record a graph that runs in PyTorch because compiling it failed.

    Re-raises what must not be swallowed: dynamo's own control flow, a missing onnxruntime,
    and any error under the ``strict`` option.
    """
    if options.strict or isinstance(error, (OrtUnavailableError, *_compat.dynamo_control_exceptions())):
        raise error
    metrics.increment("compile_failures")
    text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    metrics.warn_once(f"compile:{tag}:{text}", "ort-lazy: compiling the %s graph failed, it runs in PyTorch: %s", tag, text)
    record_failure(tag, text)


def _lowered(
    gm: torch.fx.GraphModule, options: Options, tag: str, constants: dict[int, torch.Tensor] | None, mode: str
) -> torch.fx.GraphModule:
    """A copy of the aten graph ``gm`` with its supported regions on ORT, and the graphs of its
    higher-order ops' bodies too (:func:`_lower_bodies`)."""
    work = copy_graph_module(gm)
    storage_order_views(work)
    simplify_aten(work)
    fuse_activations(work)
    # dead values (a view AOTAutograd regenerates outside the graph) would make regions
    # without outputs; ops that write stay (impure)
    work.graph.eliminate_dead_code()
    drop_unused_indices(work)
    _lower_bodies(work, options, tag)
    # AOTAutograd may call its compilers inside its fake mode; regions read real weights
    with _compat.real_tensor_mode():
        return compile_graph(work, options, tag=tag, constants=constants, weights=mode)


def lower_exported(
    gm: torch.fx.GraphModule, options: Options, constants: dict[int, torch.Tensor] | None, mode: str | None
) -> torch.fx.GraphModule:
    """Lower the inference graph of a ``torch.export`` program (aten ops, decomposed with
    :func:`~.decompositions.decomposition_table`, ``meta['val']`` set) as the dynamo door lowers
    a no-grad graph: a copy of ``gm`` with its supported regions on ORT, ``constants`` (by
    placeholder position) bound to the regions as ``mode`` says (:func:`weight_mode`).

    Unlike :func:`compile_captured` nothing is swallowed: a failure raises (a region ORT cannot
    run stays in the copy as its fused submodule, counted and warned like any).
    """
    fake_modes = {id(v.fake_mode): v.fake_mode for n in gm.graph.nodes if hasattr(v := n.meta.get("val"), "fake_mode")}
    if len(fake_modes) != 1:
        raise ValueError(f"the exported graph's values come from {len(fake_modes)} fake modes, expected one")
    (fake_mode,) = fake_modes.values()
    with _compat.tracing_context(fake_mode), torch.no_grad():
        return _lowered(gm, options, "inference", constants if mode is not None else None, mode or "snapshot")


def _lower_bodies(gm: torch.fx.GraphModule, options: Options, tag: str) -> None:
    """Lower the graphs higher-order ops of ``gm`` call (``torch.cond``'s branches, a
    ``while_loop``'s condition and body, ``map``'s and ``scan``'s functions, a nested compile
    region's body: :func:`~ort_lazy._compat.body_calling_ops`) like ``gm`` itself, in place:
    the op still runs in PyTorch and calls its body, whose regions then run on ORT. A body
    used by several ops is lowered once; one that fails to lower stays as it was (counted and
    warned, like any graph)."""
    lowered: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target in lowered:
            continue
        body = getattr(gm, node.target, None)
        if not isinstance(body, torch.fx.GraphModule) or not node.users:
            continue
        if not all(u.op == "call_function" and u.target in _compat.body_calling_ops() for u in node.users):
            continue
        name = f"{tag}_{node.target}"
        lowered.add(node.target)
        try:
            setattr(gm, node.target, _lowered(body, options, name, None, "snapshot"))
        except Exception as e:
            _failed(name, e, options)


#: on a GPU, inference weights up to this many bytes in all are copied into the model (ORT
#: keeps its own device copy and folds them); larger ones are passed as graph inputs
GPU_COPIED_WEIGHTS_BYTES = 1 << 30


def weight_mode(options: Options, device_type: str = "cpu", weight_bytes: int = 0) -> str | None:
    """How inference graphs bind their parameters (:data:`~ort_lazy.specs.WEIGHT_MODES`), or
    None to pass them as graph inputs.

    ``shared`` is a CPU mode: ORT reads an external initializer's memory on the host (a device
    pointer crashes the process). On a GPU, ``prepack_weights`` copies the weights into the
    model instead (``copied``: ORT folds them into its kernels, as for an exported model, at the
    cost of its own device copy; rebuilt when a parameter changes), up to
    :data:`GPU_COPIED_WEIGHTS_BYTES` of them (beyond, the model would outgrow ONNX's 2 GiB and
    the copy the device): larger weights are graph inputs, the same memory, without a copy.
    """
    if options.freeze_weights:
        return "snapshot"
    if options.precision != "fp32":
        return "copied"
    if not options.prepack_weights:
        return None
    if device_type == "cpu":
        return "shared"
    return "copied" if weight_bytes <= GPU_COPIED_WEIGHTS_BYTES else None


def _aot_compiler(
    options: Options, tag: str, frozen: dict[int, torch.Tensor] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    mode = mode or "snapshot"

    def build(gm: torch.fx.GraphModule, constants: dict[int, torch.Tensor] | None) -> Callable[..., Any]:
        if options.precision != "fp32" and tag in ("forward", "backward"):
            metrics.warn_once(
                f"precision-training:{options.precision}",
                "ort-lazy: precision=%r applies to inference graphs; training graphs keep their dtypes",
                options.precision,
            )
        try:
            forward = _lowered(gm, options, tag, constants, mode).forward
        except Exception as e:
            _failed(tag, e, options)
            forward = gm.forward  # the graph as AOTAutograd made it, untouched
        direct = _direct_call(forward)
        if direct is not None:
            return direct

        def run(args: list[Any]) -> Any:
            # Boxed calling convention: the list is cleared so inputs are freed early.
            call_args = list(args)
            args.clear()
            return forward(*call_args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        constants = _frozen_for(gm, frozen) if frozen else None
        if constants and mode in ("shared", "copied"):
            constants = _followable(constants, options)
        compiled = build(gm, constants)
        if not constants:
            return compiled
        return _per_weight_set(constants, compiled, lambda c: build(gm, c))

    return compiler


#: distinct sets of weights (module instances) one inference graph binds before it passes
#: further ones as graph inputs. Regional compilation (each layer of a stack compiled alone)
#: serves every layer with one graph; the graph keeps the weights it binds alive, so the bound
#: also caps what it retains of instances the program has dropped.
MAX_WEIGHT_SETS = 8


def _per_weight_set(
    constants: dict[int, torch.Tensor],
    compiled: Callable[..., Any],
    build: Callable[[dict[int, torch.Tensor] | None], Callable[..., Any]],
) -> Callable[..., Any]:
    """Dispatch each call to the compiled graph bound to the weights it is called with.

    Dynamo reuses one graph for every instance of a module class (parameters are graph
    inputs, not guarded by identity), while a graph that binds weights (initializers) was
    built with one instance's: called with another's, it would compute with the wrong ones.
    Each call checks the tensors at the bound positions by identity; another set gets a graph
    of its own (up to :data:`MAX_WEIGHT_SETS`, kept alive with their weights), then one that
    takes the weights as inputs serves every further set.
    """
    positions = tuple(constants)
    pick = operator.itemgetter(*positions) if len(positions) > 1 else (lambda args: (args[positions[0]],))
    current = tuple(constants.values())
    sets: dict[tuple[int, ...], tuple[tuple[torch.Tensor, ...], Callable[..., Any]]] = {
        tuple(map(id, current)): (current, compiled)
    }
    as_inputs: list[Callable[..., Any]] = []
    lock = threading.Lock()  # one build per new set when threads meet it together

    def known(given: tuple[Any, ...]) -> Callable[..., Any] | None:
        entry = sets.get(tuple(map(id, given)))
        return entry[1] if entry is not None and all(map(operator.is_, given, entry[0])) else None

    def for_set(given: tuple[Any, ...]) -> Callable[..., Any]:
        with lock:
            fn = known(given)
            if fn is not None:
                return fn
            if len(sets) < MAX_WEIGHT_SETS:
                metrics.increment("weight_sets")
                tensors = tuple(given)
                fn = build(dict(zip(positions, tensors)))
                sets[tuple(map(id, tensors))] = (tensors, fn)  # holds the tensors: their ids stay theirs
                return fn
            if not as_inputs:
                metrics.warn_once(
                    "weight-sets",
                    f"ort-lazy: one graph called with more than {MAX_WEIGHT_SETS} modules' weights; "
                    "further ones are passed to ORT as graph inputs",
                )
                as_inputs.append(build(None))
            return as_inputs[0]

    def run(args: list[Any]) -> Any:
        given = pick(args)
        if all(map(operator.is_, given, current)):
            return compiled(args)
        fn = known(given)  # unlocked: a set built before needs no lock
        return (fn if fn is not None else for_set(given))(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _direct_call(forward: Callable[..., Any]) -> Callable[..., Any] | None:
    """A boxed call straight into the ORT region when one region is the whole graph.

    Skips the FX module's generated code and tuple plumbing on every call; None when the graph
    has anything else in it (PyTorch ops, reordered or repeated outputs).
    """
    gm = getattr(forward, "__self__", None)
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op not in ("placeholder", "output")]
    region_calls = [n for n in calls if n.op == "call_function" and isinstance(getattr(n.target, "__self__", None), OrtRegion)]
    if len(region_calls) != 1:
        return None
    call = region_calls[0]
    region = call.target.__self__
    if region.runner is None or call.kwargs or any(a not in placeholders for a in call.args):
        return None
    out = nodes[-1].args[0]
    if not isinstance(out, (tuple, list)):
        return None
    getitems = [n for n in calls if n is not call]
    if region.tuple_output:
        # outputs must be the region's own, each once, in order
        if any(n.target is not operator.getitem or n.args[0] is not call for n in getitems):
            return None
        if list(out) != getitems or [n.args[1] for n in getitems] != list(range(len(region.runner.model.output_names) - region.runner.model.checks)):
            return None
    elif getitems or list(out) != [call]:
        return None
    index = [placeholders.index(a) for a in call.args]
    run_region = region.forward
    single = not region.tuple_output

    def run(args: list[Any]) -> Any:
        call_args = [args[i] for i in index]
        args.clear()
        result = run_region(*call_args)
        return (result,) if single else result

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _frozen_for(gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> dict[int, torch.Tensor] | None:
    """Frozen weights by placeholder position, when the graph's inputs line up with dynamo's.

    A tensor the graph writes into (a buffer updated in place, such as batch norm's running
    statistics in training mode) stays a graph input.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, tensor in frozen.items():
        val = placeholders[i].meta.get("val") if i < len(placeholders) else None
        if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(tensor.shape) or val.dtype != tensor.dtype:
            metrics.warn_once("freeze-mismatch", "ort-lazy: freeze_weights skipped: graph inputs do not line up with the weights")
            return None
    written = {n.name for n in written_placeholders(gm)}
    kept = {i: t for i, t in frozen.items() if placeholders[i].name not in written}
    return kept or None


def _module_state(gm: torch.nn.Module, example_inputs: Sequence[Any]) -> dict[int, torch.Tensor]:
    """Inputs that are module state, by position: ``nn.Parameter`` inputs, and the tensors
    dynamo took from a module's buffers (BatchNorm's running statistics, position ids)."""
    state = set(_compat.module_state_positions(gm)) if isinstance(gm, torch.fx.GraphModule) else set()
    return {
        i: t
        for i, t in enumerate(example_inputs)
        if isinstance(t, torch.Tensor) and (isinstance(t, torch.nn.Parameter) or i in state)
        and not _compat.is_fake_tensor(t) and t.device.type != "meta"
    }


def _followable(state: dict[int, torch.Tensor], options: Options) -> dict[int, torch.Tensor]:
    """The weights whose changes a bound session can follow (version counter and storage).

    Tensors made under ``torch.inference_mode()`` track no version counter, and may be written
    in place there: bound to a session, a change would go unseen. They stay graph inputs (the
    same memory, read on every call), so a result is never computed from stale weights.
    """
    kept = {i: t for i, t in state.items() if not t.is_inference()}
    if len(kept) < len(state):
        metrics.warn_once(
            "inference-tensor-weights",
            "ort-lazy: %d weights were made under torch.inference_mode() (no version counter): they are "
            "passed to ORT as graph inputs%s",
            len(state) - len(kept),
            "" if options.precision == "fp32" else f"; precision={options.precision!r} does not apply to them",
        )
    return kept


def compile_captured(gm: torch.nn.Module, example_inputs: Sequence[Any], options: Options) -> Callable[..., Any]:
    """Compile a captured graph (or module) so its supported parts run on ORT.

    Returns a callable with the graph's calling convention; on any failure, ``gm`` itself.
    """
    try:
        return _compile(gm, example_inputs, options)
    except Exception as e:
        _failed("captured", e, options)
        return gm


def _compile(gm: torch.nn.Module, example_inputs: Sequence[Any], options: Options) -> Callable[..., Any]:
    # A graph that only updates state in place (``torch.compile(optimizer.step)``) runs as
    # dynamo captured it, with PyTorch's in-place (multi-tensor) kernels, like the ops of
    # torch_preferred_ops: ORT computes each new value into fresh memory with one pass per
    # elementwise op, and the values are copied back. Adam over 1.05M parameters on 2 cores:
    # 5.6-6.8 ms per step on ORT, 1.6-3.0 ms as captured (dynamo's pass-through backend's time).
    # torch_preferred_ops=() runs it on ORT.
    if isinstance(gm, torch.fx.GraphModule) and not torch.is_grad_enabled() and options.torch_preferred_ops and _updates_only(gm):
        return _kept_update(gm)
    work: torch.nn.Module = gm
    if isinstance(gm, torch.fx.GraphModule):
        work = copy_graph_module(gm)
        lower_fast_paths(work)
    # Inference only: weights (parameters, and the buffers the graph does not write into)
    # become ORT initializers (see weight_mode), so ORT can fold and prepack them.
    device_type = _inputs_device_type(example_inputs)
    state = _module_state(work, example_inputs)
    mode = weight_mode(options, device_type, sum(t.nbytes for t in state.values()))
    frozen = state if mode is not None else None
    aot = _compat.aot_autograd(
        fw_compiler=_aot_compiler(options, "forward"),
        bw_compiler=_aot_compiler(options, "backward"),
        inference_compiler=_aot_compiler(options, "inference", frozen, mode),
        decompositions=decomposition_table(options.cache_dir, options.torch_ops),
        keep_inference_input_mutations=True,
        partition_fn=partition,
    )
    if not torch.is_grad_enabled() and isinstance(work, torch.fx.GraphModule):
        inference = _inference_graph(work, example_inputs, options, frozen, device_type, mode)
        if inference is not None:
            return inference
    # Attention traced through the math path: its backward is ordinary ops ORT runs, where the
    # fused CPU kernel's backward has no ONNX mapping (and its logsumexp translation is wrong).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return aot(work, example_inputs)


def _updates_only(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` returns nothing and reads tensors of its own (dynamo's ``get_attr``): a
    graph that only writes into state dynamo holds, such as an optimizer's step."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    result = output.args[0]
    return isinstance(result, (tuple, list)) and not result and bool(_state_of(gm))


def _kept_update(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` as dynamo captured it, counted as kept in PyTorch (see :func:`_compile`) in the
    metrics and in what ``explain`` records."""
    ops = [
        f"Tensor.{node.target}" if node.op == "call_method" else op_name(node.target)
        for node in gm.graph.nodes
        if node.op in ("call_method", "call_function")
    ]
    record = new_record("inference")
    record.ops = [(op, Reason.PREFERRED) for op in ops]
    record.steps = [{"pytorch": list(record.ops)}]
    for op in ops:
        metrics.record_fallback(op, Reason.PREFERRED)
    metrics.warn_once(
        "update-graph",
        "ort-lazy: a graph that only updates state in place (an optimizer's step) runs in PyTorch, whose "
        "in-place kernels are faster than ORT's functional form of it; torch_preferred_ops=() runs it on ORT",
        level=logging.INFO,
    )
    return gm


def _inference_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Options,
    frozen: dict[int, torch.Tensor] | None,
    device_type: str = "cpu",
    mode: str | None = None,
) -> Callable[..., Any] | None:
    """Compile a no-grad dynamo graph without AOTAutograd; None when it cannot be lowered so."""
    from torch.fx.experimental.proxy_tensor import make_fx

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_args = [n.meta.get("example_value") for n in placeholders]
    if any(a is None for a in fake_args) or len(fake_args) != len(example_inputs):
        return None
    # the mode dynamo made the graph's example values with (not necessarily the tracing
    # context's, which detect_fake_mode would prefer)
    modes = {id(a.fake_mode): a.fake_mode for a in fake_args if hasattr(a, "fake_mode")}
    if len(modes) != 1:
        return None
    (fake_mode,) = modes.values()
    # The graph's own tensors (dynamo's get_attr: an optimizer's parameters and state) are
    # traced as inputs, as AOTAutograd lifts them: traced as constants, an in-place op on one
    # with no fake operand would run for real while tracing (an optimizer's step count went up
    # once more), and a write into one could not become a copy back into it.
    state = _state_of(gm)
    names = list(state)
    if names:
        target: Callable[..., Any] = _with_state(gm, names)
        with _compat.real_tensor_mode():
            fake_args = [fake_mode.from_tensor(t, static_shapes=True) for t in state.values()] + fake_args
        if frozen is not None:
            frozen = {**dict(enumerate(state.values())), **{i + len(names): t for i, t in frozen.items()}}
    else:
        target = gm
    table = decomposition_table(options.cache_dir, options.torch_ops)
    try:
        with fake_mode, _compat.python_dispatcher(fake_mode), torch.no_grad(), _attention_backends(device_type):
            aten = make_fx(_compat.functionalize(target), decomposition_table=table)(*fake_args)
            # Decompositions run below functionalization: one that writes in place (circular
            # padding's copies into a fresh tensor) leaves a mutation of an intermediate in
            # the graph. Functionalize the decomposed graph again so every such write becomes
            # a value ORT computes (only input mutations stay, as copies back into the inputs).
            for attempt in range(3):
                if not _mutates_intermediates(aten):
                    break
                if attempt == 2:
                    return None  # AOTAutograd functionalizes it
                aten = make_fx(_compat.functionalize(aten), decomposition_table=table)(*fake_args)
    except Exception as e:  # anything unusual goes through AOTAutograd as usual
        logger.debug("ort-lazy: direct inference lowering failed (%s); using AOTAutograd", e)
        return None
    _constants_in_mode(aten, fake_mode)
    # passes that look up the fake mode through the tracing context must find this graph's
    with _compat.tracing_context(fake_mode):
        compiled = _aot_compiler(options, "inference", frozen, mode)(aten, fake_args)

    if not names:

        def run(*args: Any) -> Any:
            return compiled(list(args))

        return run

    read_state = operator.attrgetter(*names)
    single = len(names) == 1

    def run_with_state(*args: Any) -> Any:
        state = read_state(gm)
        return compiled([state, *args] if single else [*state, *args])

    return run_with_state


def _state_of(gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    """The parameters and buffers of ``gm`` its graph reads (``get_attr``), by name."""
    own = {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    return {name: tensor for name, tensor in own.items() if name in read}


def _with_state(gm: torch.fx.GraphModule, names: list[str]) -> Callable[..., Any]:
    """``gm`` as a function of its tensors ``names`` followed by its inputs."""

    def call(*args: Any) -> Any:
        return torch.func.functional_call(gm, dict(zip(names, args[: len(names)])), tuple(args[len(names) :]))

    return call


def _attention_backends(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """Which attention kernels tracing may pick on ``device_type``.

    On a GPU, attention is traced through the math path: the fused kernels' ops there
    (``_scaled_dot_product_efficient_attention``, ``_flash_attention``, ``_cudnn_attention``)
    have no ONNX translation and would split the graph around every attention. On the CPU the
    fused kernel's op is translated and kept.
    """
    if device_type == "cpu":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def _inputs_device_type(example_inputs: Sequence[Any]) -> str:
    """``cuda`` when any example input tensor is on a GPU, else ``cpu``."""
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return "cuda"
    return "cpu"


def _mutates_intermediates(gm: torch.fx.GraphModule) -> bool:
    """Whether an op of ``gm`` writes into a tensor that is not one of the graph's inputs."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        for arg, value in zip(target._schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write:
                if not (isinstance(value, torch.fx.Node) and value.op == "placeholder"):
                    return True
    return False


def _constants_in_mode(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """Give tensor constants (``get_attr``) fake values of the graph's own fake mode.

    ``make_fx`` describes a constant the traced code made (``torch.tensor([...])``) with a fake
    tensor of another mode; export mixes the two and fails. In place.
    """
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target, None)
        meta = node.meta.get("val")
        if isinstance(value, torch.Tensor) and getattr(meta, "fake_mode", None) is not fake_mode:
            with _compat.real_tensor_mode():
                node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)

"""TorchDynamo front door: ``torch.compile(model, backend="ort")``.

Registered through the ``torch_dynamo_backends`` entry point, so no import is needed. Uses
AOTAutograd with forward, backward and inference compilers; each compiler hands its aten graph
to :func:`ort_lazy.partition.compile_graph`.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat, metrics
from ..lowering import lower_fast_paths
from ..options import Options
from ..partition import OrtRegion, compile_graph
from ..runtime.flavour import OrtUnavailableError

__all__ = ["ort_backend", "make_backend", "compile"]

logger = logging.getLogger("ort_lazy")


def _aot_compiler(options: Options, tag: str, frozen: dict[int, torch.Tensor] | None = None) -> Callable[..., Any]:
    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        constants = _frozen_for(gm, frozen) if frozen else None
        try:
            forward = compile_graph(gm, options, tag=tag, constants=constants).forward
        except OrtUnavailableError:
            raise
        except Exception as e:  # a fault in partitioning must not break the model: run it in PyTorch
            metrics.increment("export_failures")
            metrics.warn_once(f"compile:{tag}:{type(e).__name__}", "ort-lazy: compiling the %s graph failed, it runs in PyTorch: %s", tag, e)
            forward = gm.forward
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

    return compiler


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
        if list(out) != getitems or [n.args[1] for n in getitems] != list(range(len(region.runner.model.output_names))):
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
    """Frozen weights by placeholder position, when the graph's inputs line up with dynamo's."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, tensor in frozen.items():
        val = placeholders[i].meta.get("val") if i < len(placeholders) else None
        if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(tensor.shape) or val.dtype != tensor.dtype:
            metrics.warn_once("freeze-mismatch", "ort-lazy: freeze_weights skipped: graph inputs do not line up with the weights")
            return None
    return frozen


def make_backend(options: Options | Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A dynamo backend callable bound to ``options`` (an :class:`Options` or a dict of fields)."""
    opts = _resolve(options)

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable[..., Any]:
        return _compile_dynamo_graph(gm, example_inputs, opts)

    return backend


def _resolve(options: Options | Mapping[str, Any] | None) -> Options:
    if isinstance(options, Options):
        return options
    return Options.from_env(**dict(options or {}))


def _compile_dynamo_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: Options) -> Callable[..., Any]:
    if isinstance(gm, torch.fx.GraphModule):
        lower_fast_paths(gm)
    # Inference only: weights (nn.Parameter inputs) are snapshot into the ONNX models.
    frozen = {i: t for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)} if opts.freeze_weights else None
    aot = _compat.aot_autograd(
        fw_compiler=_aot_compiler(opts, "forward"),
        bw_compiler=_aot_compiler(opts, "backward"),
        inference_compiler=_aot_compiler(opts, "inference", frozen),
        decompositions=_compat.decomposition_table(opts.cache_dir),
        keep_inference_input_mutations=True,
    )
    if not torch.is_grad_enabled() and isinstance(gm, torch.fx.GraphModule):
        # Dynamo guards on grad mode, so this graph only ever runs without autograd: lower it
        # to aten directly and skip AOTAutograd's per-call runtime wrappers.
        inference = _inference_graph(gm, example_inputs, opts, frozen)
        if inference is not None:
            return inference
    # Attention traced through the math path: its backward is ordinary ops ORT runs, where the
    # fused CPU kernel's backward has no ONNX mapping (and its logsumexp translation is wrong).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return aot(gm, example_inputs)


def _inference_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: Options, frozen: dict[int, torch.Tensor] | None
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
    try:
        with fake_mode, torch.no_grad():
            aten = make_fx(
                torch.func.functionalize(gm, remove="mutations"),
                decomposition_table=_compat.decomposition_table(opts.cache_dir),
            )(*fake_args)
    except Exception as e:  # anything unusual goes through AOTAutograd as usual
        logger.debug("ort-lazy: direct inference lowering failed (%s); using AOTAutograd", e)
        return None
    # passes that look up the fake mode through the tracing context must find this graph's
    with _compat.tracing_context(fake_mode):
        compiled = _aot_compiler(opts, "inference", frozen)(aten, fake_args)

    def run(*args: Any) -> Any:
        return compiled(list(args))

    return run


def ort_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | Options | None = None) -> Callable[..., Any]:
    """The ``ort`` dynamo backend: ``torch.compile(model, backend="ort", options={...})``."""
    return _compile_dynamo_graph(gm, example_inputs, _resolve(options))


def compile(model: Any, *, dynamic: bool | None = None, fullgraph: bool = False, **options: Any) -> Any:
    """``torch.compile(model, backend="ort")`` with ort-lazy options as keyword arguments.

    ``dynamic`` is both torch.compile's and :attr:`Options.dynamic`: ``False`` compiles for
    concrete shapes only, ``None`` (default) follows ``ORT_LAZY_DYNAMIC`` (on: dynamo turns
    dims symbolic once they change and one ONNX model serves every size).
    """
    if dynamic is not None:
        options["dynamic"] = dynamic
    opts = Options.from_env(**options)
    torch_dynamic = dynamic if dynamic is not None else (None if opts.dynamic else False)
    return torch.compile(model, backend=functools.partial(ort_backend, options=opts), dynamic=torch_dynamic, fullgraph=fullgraph)

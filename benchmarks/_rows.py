"""The rows of the benchmark suite: how each is built, called and checked against eager.

A row is one way of running a model in one mode (:class:`Backend`); :data:`BACKENDS` holds
every row the suite knows:

* ``eager``: plain PyTorch;
* ``dynamo``: ``torch.compile(model, backend="eager")``: dynamo's own tracing and guard cost;
* ``inductor``: ``torch.compile(model)`` (Inductor, its caches off so the first call is cold);
* ``ort``: ``torch.compile(model, backend="ort")``;
* ``ort+freeze``: the same with ``freeze_weights=True`` (inference, with ``--freeze``);
* ``floor``: the ONNX graphs ort-lazy runs, executed directly by ORT with inputs and outputs
  bound once (IOBinding, ``run_with_iobinding``), same session options (inference only);
* ``floor+freeze``: the floor of the frozen graphs (inference, with ``--freeze``);
* ``aot-eager``: ``torch.compile(model, backend="aot_eager")`` (training): dynamo and
  AOTAutograd with PyTorch's own kernels, what every backend behind AOTAutograd (Inductor,
  ort-lazy's training graphs) pays before its kernels run; the ``ort`` training row's ``x floor``
  is against it;
* ``best-ort``: the best direct ORT run of the same model: ``torch.onnx.export(dynamo=True)``
  with its optimizer, weights as initializers, ORT's default CPU session options, inputs and
  outputs bound once (inference only). Every row reports ``x best`` against it;
* ``dynamo+best-ort``: ``torch.compile`` with the least backend on ORT: its compiled function
  binds the model's inputs and fresh outputs to ``best-ort``'s session and runs it, nothing
  else (inference). Its ``x best`` is dynamo's own per-call cost, which no ``torch.compile``
  backend avoids; ``ort``'s ratio to it is the per-call cost ort-lazy adds;
* ``ort-int8``: ``torch.compile(backend="ort")`` with ``precision="int8-dynamic"`` (inference):
  ``x ort`` is its time over the fp32 ``ort`` row's, ``max rel`` its largest error against eager
  over eager's largest magnitude (int8 is approximate);
* ``ort-fast``: ``fast_math=True`` (ORT's approximate logistic, max pooling without eager's
  NaN rule): ``x ort`` and ``max rel`` as for ``ort-int8``;
* ``ort-fp16``: ``precision="fp16"`` (inference, ``--device cuda`` only, where it is a default
  row): ``x ort`` and ``max rel`` as for ``ort-int8``;
* ``eager-mixed`` / ``ort-mixed``: the mixed regime, each call right after one 512x512 PyTorch
  matmul (what a graph with PyTorch work between ORT regions, or a training step, sees). The
  matmul's own time, measured alone, is taken off: ``penalty`` is the remaining time over the
  same backend's time alone.

Rows per execution provider (:data:`PROVIDERS`; each :class:`Provider` gets the same rows, named
after its short name, here OpenVINO's):

* ``ort-openvino``: ``torch.compile(backend="ort", options={"providers": "openvino,cpu"})``;
* ``best-ort-openvino``: ``best-ort``'s exported model run on the provider first, then the CPU
  provider, ORT's default session and provider options, inputs and outputs bound once;
* ``openvino``: the provider's own ``torch.compile`` backend (the peer), here OpenVINO's
  (``import openvino.torch``; ``backend="openvino"``).

``x best`` of a provider's rows is against the provider's own ``best-ort-<name>`` row, that
row's against ``best-ort`` (the provider's best run over the CPU provider's); ``x peer`` of
``ort-<name>`` is against the peer. These rows are run only where the provider (or the peer's
package) is installed: :func:`missing` says what to install otherwise.

Besides the built-in models (:data:`ort_lazy.models.BUILTIN`), the suite takes real models
(:data:`_models.ZOO`: BERT, GPT-2, ResNet-18, EfficientNet-B0, ViT-Tiny from transformers'
classes, random weights).

Modes: ``inference`` (eval, ``torch.no_grad``) and ``train`` (forward, ``backward``, SGD step).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import importlib.util
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from _floor import FloorRunner, capture_regions, export_floor, least_backend
from _models import ZOO

__all__ = [
    "BACKENDS", "DEFAULT_BACKENDS", "MIXED_MM", "MODES", "PROVIDERS", "Backend", "Case", "Peer", "Prepared",
    "Provider", "Row", "check_against_eager", "default_backends", "grad_mode", "known_models", "missing",
    "peer_compile", "peer_compiling", "provider_rows",
]

MODES = ("inference", "train")
DEFAULT_BACKENDS = (
    "eager", "dynamo", "inductor", "aot-eager", "ort", "floor", "best-ort", "dynamo+best-ort", "ort-int8", "eager-mixed",
    "ort-mixed",
)
#: the PyTorch work before each call of a mixed-regime row: one matmul of this size
MIXED_MM = 512


def known_models() -> dict[str, Any]:
    """Every model ``--models`` accepts: the built-ins, then the zoo."""
    from ort_lazy.models import BUILTIN

    return {**BUILTIN, **ZOO}


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass
class Case:
    """One model in one mode, with everything a backend needs to build its row."""

    model_name: str
    mode: str
    template: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    threads: int
    ort_options: dict[str, Any]
    #: where the model and its inputs live (``cpu`` or ``cuda``)
    device: str = "cpu"

    @property
    def train(self) -> bool:
        """Whether rows run a training step."""
        return self.mode == "train"

    def fresh_model(self) -> torch.nn.Module:
        """A copy of the template (same weights) in the mode's train/eval state."""
        model = copy.deepcopy(self.template)
        return model.train() if self.train else model.eval()


@dataclasses.dataclass
class Prepared:
    """A built row: one call (``step``), the first call's time and output, and notes."""

    step: Callable[[], Any]
    first_call_s: float
    output: Any = None
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Backend:
    """A way to run a :class:`Case`; ``build`` compiles it and makes the first call."""

    name: str
    modes: tuple[str, ...]
    build: Callable[[Case], Prepared]
    floor_of: dict[str, str] = dataclasses.field(default_factory=dict)  # mode -> the row ``vs_floor`` uses
    alone: str | None = None  # mixed-regime rows: the row of the same backend called alone
    reduced: bool = False  # a reduced-precision or fast_math row: compared with the fp32 ``ort`` row
    devices: tuple[str, ...] = ("cpu", "cuda")  # where the row means something
    best: str = "best-ort"  # the row its ``x best`` is against (a provider's rows: its own best run)
    peer: str | None = None  # the row its ``x peer`` is against (the provider's own torch.compile backend)
    #: what the row needs installed: None when it can run here, else what to install
    needs: Callable[[], str | None] = lambda: None


@dataclasses.dataclass
class Row:
    """One line of the results table (times in milliseconds, memory in MiB)."""

    model: str
    mode: str
    backend: str
    status: str = "ok"
    error: str | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    mean_ms: float | None = None
    min_ms: float | None = None
    calls: int = 0
    first_call_s: float | None = None
    peak_mib: float | None = None
    retained_mib: float | None = None
    max_abs_diff: float | None = None
    #: max |output - eager's| / max |eager's output|
    max_rel_diff: float | None = None
    vs_eager: float | None = None
    vs_floor: float | None = None
    vs_inductor: float | None = None
    #: median over the best direct ORT run's median (``best-ort``)
    vs_best: float | None = None
    #: reduced-precision and fast_math rows: median over the exact fp32 ``ort`` row's median
    vs_ort: float | None = None
    #: mixed-regime rows: (median - the PyTorch matmul's time alone) / the backend's median alone
    mixed_penalty: float | None = None
    #: ``ort-<provider>`` rows: median over the provider's own torch.compile backend's (the peer)
    vs_peer: float | None = None
    first_vs_inductor: float | None = None
    #: (first call - dynamo's first call) / (Inductor's first call - dynamo's first call):
    #: the backend's own compile time against Inductor's, without the trace both share
    compile_vs_inductor: float | None = None
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- steps


def _loss(out: Any) -> torch.Tensor:
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().square().mean()


def _train_step(fn: Callable[..., Any], model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """forward, loss, backward, SGD step (inputs need grad when the model has no parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        args = tuple(inputs)
        opt: torch.optim.Optimizer | None = torch.optim.SGD(params, lr=1e-4)
    else:
        args = tuple(x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs)
        opt = None
    leaves = [a for a in args if a.requires_grad]

    def step() -> torch.Tensor:
        loss = _loss(fn(*args))
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for leaf in leaves:
            leaf.grad = None
        return loss.detach()

    return step


def _make_step(case: Case, fn: Callable[..., Any], model: torch.nn.Module) -> Callable[[], Any]:
    if case.train:
        return _train_step(fn, model, case.inputs)
    inputs = case.inputs
    return lambda: fn(*inputs)


def _first_call(case: Case, step: Callable[[], Any]) -> tuple[float, Any]:
    with grad_mode(case.train):
        start = time.perf_counter()
        out = step()
        if case.device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    return elapsed, out


def grad_mode(train: bool) -> contextlib.AbstractContextManager[Any]:
    """Gradients on for a training step, off (``torch.no_grad``) for inference."""
    return contextlib.nullcontext() if train else torch.no_grad()


# ----------------------------------------------------------------------------- backends


def _build_eager(case: Case) -> Prepared:
    model = case.fresh_model()
    step = _make_step(case, model, model)
    first, out = _first_call(case, step)
    return Prepared(step, first, out)


def _build_compiled(case: Case, **compile_kwargs: Any) -> Prepared:
    """``torch.compile(model, **compile_kwargs)``: Inductor by default; ``backend="eager"`` is
    dynamo's own cost (tracing, guards), shared by every backend."""
    model = case.fresh_model()
    compiled = torch.compile(model, **compile_kwargs)
    step = _make_step(case, compiled, model)
    first, out = _first_call(case, step)
    return Prepared(step, first, out)


def _ort_counters() -> dict[str, int]:
    from ort_lazy import metrics

    return metrics.counters()


def _ep_nodes() -> dict[str, int]:
    from ort_lazy import metrics

    return metrics.ep_nodes()


def _placement(nodes: Mapping[str, int], provider: str) -> str:
    """``provider``'s share of ONNX nodes, as the notes give it: ``OpenVINOExecutionProvider
    41/43 nodes``."""
    total = sum(nodes.values())
    return f"{provider} {nodes.get(provider, 0)}/{total} nodes" if total else ""


def _build_ort(
    case: Case,
    freeze: bool = False,
    precision: str | None = None,
    fast_math: bool = False,
    provider: Provider | None = None,
) -> Prepared:
    """``torch.compile(backend="ort")`` with the row's options; ``provider``: its providers
    first (``options["providers"]``), the notes saying how many ONNX nodes it took."""
    model = case.fresh_model()
    options = dict(case.ort_options)
    if freeze:
        options["freeze_weights"] = True
    if precision is not None:
        options["precision"] = precision
    if fast_math:
        options["fast_math"] = True
    if provider is not None:
        options["providers"] = ",".join(provider.chain)
    compiled = torch.compile(model, backend="ort", options=options)
    step = _make_step(case, compiled, model)
    before, nodes_before = _ort_counters(), _ep_nodes()
    first, out = _first_call(case, step)
    after, nodes_after = _ort_counters(), _ep_nodes()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    keep = ("regions_on_ort", "fallback_regions", "fallback_ops", "export_failures", "ort_failures")
    extra: dict[str, Any] = {k: delta.get(k, 0) for k in keep}
    note = f"regions={extra['regions_on_ort']}"
    if extra["fallback_ops"]:
        note += f" fallback_ops={extra['fallback_ops']}"
    if extra["ort_failures"] or extra["export_failures"]:
        note += f" failures={extra['ort_failures'] + extra['export_failures']}"
    if provider is not None:
        nodes = {k: v - nodes_before.get(k, 0) for k, v in nodes_after.items() if v > nodes_before.get(k, 0)}
        extra["ep_nodes"] = nodes
        if nodes:
            note += f", {_placement(nodes, provider.ort_name)}"
    return Prepared(step, first, out, note=note, extra=extra)


def _build_best_ort(case: Case, provider: Provider | None = None) -> Prepared:
    """``torch.onnx.export(dynamo=True, optimize=True)``, default ORT options, IOBinding;
    ``provider``: on its providers (ORT's default options for each), the notes saying how
    many ONNX nodes it took (counted on a second session: the timed one has ORT's defaults)."""
    if case.train:
        raise ValueError("the best ORT run is measured for inference only")
    chain = provider.chain if provider is not None else None
    start = time.perf_counter()
    runner = export_floor(case.fresh_model(), case.inputs, case.threads, optimize=True, default_options=True, providers=chain)
    runner()
    first = time.perf_counter() - start
    outs = runner.outputs()
    note = "torch.onnx.export(dynamo=True, optimize=True)"
    extra: dict[str, Any] = {}
    if provider is not None:
        used = runner.sessions[0].get_providers()
        if used[0] != provider.ort_name:
            raise RuntimeError(f"ORT put the session on {used}, not on {provider.ort_name}")
        nodes = _assignment(runner.calls[0].model_bytes, case.threads, provider.chain)
        extra["ep_nodes"] = nodes
        if nodes:
            note += f", {_placement(nodes, provider.ort_name)}"
    return Prepared(runner, first, outs[0] if len(outs) == 1 else None, note=note, extra=extra)


def _assignment(model_bytes: bytes, threads: int, providers: Sequence[str]) -> dict[str, int]:
    """ONNX nodes per provider in a session of ``model_bytes`` on ``providers`` (ORT's node
    assignment, recorded by ORT 1.23 and later; empty before)."""
    import onnxruntime as ort

    from ort_lazy.runtime import providers as eps

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    try:
        sess = ort.InferenceSession(model_bytes, sess_options=so, providers=list(providers))
    except Exception:  # a figure for the notes, not a reason to lose the row
        return {}
    return eps.ep_nodes(sess) or {}


def _build_dynamo_best_ort(case: Case) -> Prepared:
    """``torch.compile`` with :func:`_floor.least_backend` over the best direct ORT run's session."""
    if case.train:
        raise ValueError("the best ORT run is measured for inference only")
    model = case.fresh_model()
    runner = export_floor(case.fresh_model(), case.inputs, case.threads, optimize=True, default_options=True)
    step = _make_step(case, torch.compile(model, backend=least_backend(runner, case.inputs)), model)
    first, out = _first_call(case, step)
    return Prepared(step, first, out, note="torch.compile, binding and running best-ort's session")


def _mixed(build: Callable[[Case], Prepared]) -> Callable[[Case], Prepared]:
    """A row of ``build``'s backend whose every call follows one PyTorch matmul."""

    def build_mixed(case: Case) -> Prepared:
        p = build(case)
        a = torch.randn(MIXED_MM, MIXED_MM)
        b = torch.randn(MIXED_MM, MIXED_MM)
        work = torch.empty(MIXED_MM, MIXED_MM)
        inner = p.step
        # the matmul's own time, taken inside the very calls the row times (a separate
        # measurement on a shared machine can exceed the whole call's and make the penalty < 0)
        pre_samples: list[float] = []

        def step() -> Any:
            t0 = time.perf_counter()
            torch.mm(a, b, out=work)
            pre_samples.append(time.perf_counter() - t0)
            return inner()

        note = f"after a {MIXED_MM}x{MIXED_MM} torch matmul"
        return Prepared(step, p.first_call_s, p.output, note=note, extra={**p.extra, "pre_samples": pre_samples})

    return build_mixed


def _build_floor(case: Case, freeze: bool = False) -> Prepared:
    if case.train:
        raise ValueError("the floor is measured for inference only")
    options = dict(case.ort_options)
    if freeze:
        options["freeze_weights"] = True
    source = "ort-lazy graph"
    error = None
    try:
        calls = capture_regions(case.fresh_model(), case.inputs, options)
        if not calls:
            raise RuntimeError("ort-lazy ran no ORT region")
    except Exception as e:  # the floor still exists when ort-lazy fails: export it directly
        error = f"{type(e).__name__}: {e}"
        calls = []
    start = time.perf_counter()
    if calls:
        runner = FloorRunner(calls)
    else:
        source = "torch.onnx.export"
        runner = export_floor(case.fresh_model(), case.inputs, case.threads)
    runner()
    first = time.perf_counter() - start
    out = runner.outputs()[0] if runner.regions == 1 and len(runner.outputs()) == 1 else None
    note = f"{source}, regions={runner.regions}"
    if error:
        note += f" (capture failed: {error[:120]})"
    return Prepared(runner, first, out, note=note, extra={"floor_source": source, "regions": runner.regions})


# ----------------------------------------------------------------------------- providers


@dataclasses.dataclass(frozen=True)
class Peer:
    """A provider's own ``torch.compile`` backend, measured beside ort-lazy on that provider.

    Importing ``module`` registers ``backend``. The settings of dynamo that the import changes
    for the whole process (OpenVINO's turns ``inline_inbuilt_nn_modules`` off) are undone after
    it and applied only while the peer compiles, so the other rows run with dynamo's own.
    """

    name: str  # its row
    module: str  # imported before compiling: registers the backend
    backend: str  # torch.compile's name for it
    install: str  # what to install where ``module`` is missing
    #: ``torch.compile``'s options for it
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: what the backend did, watched while it compiles: a context manager yielding a dict that
    #: ``describe`` turns into the row's note (raising where it handed the graph elsewhere)
    watch: Callable[[], contextlib.AbstractContextManager[dict[str, Any]]] | None = None
    describe: Callable[[dict[str, Any]], str] | None = None
    why: str = ""  # said in the row's note: how the peer is set up


@dataclasses.dataclass(frozen=True)
class Provider:
    """An execution provider measured with rows of its own (:func:`provider_rows`):
    ``ort-<key>`` (ort-lazy on ``chain``), ``best-ort-<key>`` (``best-ort``'s model directly on
    ``chain``) and, when it has one, its ``peer``."""

    key: str  # the short name the rows are named after
    label: str  # for people: the targets' text
    chain: tuple[str, ...]  # ORT's providers in priority order (ORT's names), the provider first
    install: str  # what to install where the installed onnxruntime lacks it
    devices: tuple[str, ...] = ("cpu",)  # where its rows are measured
    peer: Peer | None = None

    @property
    def ort_name(self) -> str:
        """ORT's name for the provider."""
        return self.chain[0]

    def modes(self) -> tuple[str, ...]:
        """The modes ort-lazy runs on it: inference only for a provider whose reader takes
        inference graphs only (ort-lazy gives training graphs to ORT's kernel providers)."""
        from ort_lazy.runtime.providers import traits_of

        return ("inference",) if traits_of(self.ort_name).inference_only else MODES

    def needs(self) -> str | None:
        """None where the installed onnxruntime has every provider of ``chain``, else what to install."""
        try:
            import onnxruntime as ort

            available = set(ort.get_available_providers())
        except Exception as e:  # pragma: no cover - the suite needs onnxruntime anyway
            return f"onnxruntime does not load ({type(e).__name__}: {e})"
        absent = [p for p in self.chain if p not in available]
        if not absent:
            return None
        return f"the installed onnxruntime has no {', '.join(absent)} (available: {', '.join(sorted(available))}); {self.install}"


_peer_changes: dict[str, dict[str, Any]] = {}


def _import_peer(peer: Peer) -> dict[str, Any]:
    """Import ``peer.module`` once; the dynamo settings the import changed, which are undone."""
    if peer.module not in _peer_changes:
        import torch._dynamo

        before = torch._dynamo.config.get_config_copy()
        importlib.import_module(peer.module)
        after = torch._dynamo.config.get_config_copy()
        changes = {k: v for k, v in after.items() if k in before and before[k] != v}
        for k in changes:
            setattr(torch._dynamo.config, k, before[k])
        _peer_changes[peer.module] = changes
    return _peer_changes[peer.module]


@contextlib.contextmanager
def peer_compiling(peer: Peer) -> Iterator[dict[str, Any]]:
    """The context the peer compiles in (its first call): its module imported, the dynamo
    settings its import changed, its watch; yields what the watch saw."""
    import torch._dynamo

    changes = _import_peer(peer)
    with torch._dynamo.config.patch(changes):
        if peer.watch is None:
            yield {}
        else:
            with peer.watch() as seen:
                yield seen


def peer_compile(peer: Peer, model: torch.nn.Module) -> Callable[..., Any]:
    """``torch.compile(model, backend=peer.backend)`` with the peer's options (it compiles at
    its first call, which must run inside :func:`peer_compiling`). The module is imported
    first: torch's lookup of the backend would import it itself (an entry point), keeping the
    settings it changes."""
    _import_peer(peer)
    options = copy.deepcopy(dict(peer.options)) or None
    return torch.compile(model, backend=peer.backend, options=options)


def _build_peer(case: Case, peer: Peer) -> Prepared:
    """The peer's ``torch.compile`` backend; its first call (the compile) under its settings."""
    if case.train:
        raise ValueError(f"{peer.name} is measured for inference only")
    model = case.fresh_model()
    with peer_compiling(peer) as seen:
        step = _make_step(case, peer_compile(peer, model), model)
        first, out = _first_call(case, step)
    note = peer.describe(seen) if peer.describe is not None else ""
    if peer.why:
        note += f"{', ' if note else ''}{peer.why}"
    return Prepared(step, first, out, note=note, extra={"peer": dict(seen)})


@contextlib.contextmanager
def _openvino_watch() -> Iterator[dict[str, Any]]:
    """What OpenVINO's backend does while it compiles: the graphs it partitions, its OpenVINO
    partitions and the ops it leaves to PyTorch. Where it fails on a graph it hands the graph
    to Inductor without a word; here that is an error naming OpenVINO's failure instead (a row
    named ``openvino`` timing Inductor would be a wrong figure)."""
    import sys

    from openvino.frontend.pytorch.torchdynamo import backend as ov_backend
    from openvino.frontend.pytorch.torchdynamo.partition import Partitioner

    seen: dict[str, Any] = {"graphs": 0, "partitions": 0, "torch_ops": []}
    make_partitions = Partitioner.make_partitions
    compile_fx = ov_backend.compile_fx

    def partitions(self: Any, graph_module: torch.fx.GraphModule, options: Any) -> torch.fx.GraphModule:
        fused = make_partitions(self, graph_module, options)
        seen["graphs"] += 1
        for node in fused.graph.nodes:
            if node.op == "call_module" and "fused_" in node.name:
                seen["partitions"] += 1
            elif node.op == "call_function":
                seen["torch_ops"].append(str(node.target))
        return fused

    def handed_to_inductor(*args: Any, **kwargs: Any) -> Any:
        cause = sys.exc_info()[1]  # called inside the backend's ``except``: OpenVINO's own error
        raise RuntimeError(
            f"OpenVINO's backend failed and handed the graph to Inductor: {type(cause).__name__}: {cause}"
        ) from cause

    Partitioner.make_partitions = partitions  # type: ignore[method-assign]
    ov_backend.compile_fx = handed_to_inductor
    try:
        yield seen
    finally:
        Partitioner.make_partitions = make_partitions  # type: ignore[method-assign]
        ov_backend.compile_fx = compile_fx


def _openvino_describe(seen: dict[str, Any]) -> str:
    ops = seen.get("torch_ops", [])
    note = f"graphs={seen.get('graphs', 0)} openvino_partitions={seen.get('partitions', 0)}"
    if ops:
        shown = ", ".join(sorted(set(ops))[:3])
        note += f" torch_ops={len(ops)} ({shown}{', ...' if len(set(ops)) > 3 else ''})"
    if not seen.get("partitions"):
        note += ": nothing ran on OpenVINO"
    return note


#: OpenVINO's CPU plugin computes in bfloat16 by default on a CPU with bfloat16 units; every
#: other row computes in float32, so its peer is asked for float32
OPENVINO_FP32 = {"config": {"INFERENCE_PRECISION_HINT": "f32"}}

#: The providers with rows of their own (a future one, CUDA or TensorRT, is one more entry).
PROVIDERS: tuple[Provider, ...] = (
    Provider(
        key="openvino",
        label="OpenVINO",
        chain=("OpenVINOExecutionProvider", "CPUExecutionProvider"),
        install="pip install onnxruntime-openvino (ORT with the OpenVINO execution provider, in place of onnxruntime; "
        "python build.py --use_openvino does it)",
        peer=Peer(
            name="openvino",
            module="openvino.torch",
            backend="openvino",
            install="pip install openvino (its openvino.torch registers torch.compile(backend='openvino'))",
            options=OPENVINO_FP32,
            watch=_openvino_watch,
            describe=_openvino_describe,
            why="INFERENCE_PRECISION_HINT=f32",
        ),
    ),
)


def _peer_needs(peer: Peer) -> Callable[[], str | None]:
    def needs() -> str | None:
        top = peer.module.split(".")[0]
        return None if importlib.util.find_spec(top) is not None else f"{top} is not installed: {peer.install}"

    return needs


def _needing(build: Callable[[Case], Prepared], needs: Callable[[], str | None]) -> Callable[[Case], Prepared]:
    """``build``, refusing with what to install where ``needs`` says something is missing."""

    def checked(case: Case) -> Prepared:
        missing_ = needs()
        if missing_:
            raise RuntimeError(missing_)
        return build(case)

    return checked


def provider_rows(provider: Provider) -> dict[str, Backend]:
    """The rows of ``provider``: ``ort-<key>``, ``best-ort-<key>`` and its peer's."""
    ort_row, best_row = f"ort-{provider.key}", f"best-ort-{provider.key}"
    peer = provider.peer
    rows = {
        ort_row: Backend(
            ort_row, provider.modes(), _needing(lambda c: _build_ort(c, provider=provider), provider.needs),
            devices=provider.devices, best=best_row, peer=peer.name if peer else None, needs=provider.needs,
        ),
        best_row: Backend(
            best_row, ("inference",), _needing(lambda c: _build_best_ort(c, provider), provider.needs),
            devices=provider.devices, needs=provider.needs,
        ),
    }
    if peer is not None:
        needs = _peer_needs(peer)
        rows[peer.name] = Backend(
            peer.name, ("inference",), _needing(lambda c: _build_peer(c, peer), needs),
            devices=provider.devices, best=best_row, needs=needs,
        )
    return rows


#: Every backend the suite knows; tests may add their own.
BACKENDS: dict[str, Backend] = {
    "eager": Backend("eager", MODES, _build_eager),
    "dynamo": Backend("dynamo", MODES, lambda c: _build_compiled(c, backend="eager")),
    "inductor": Backend("inductor", MODES, _build_compiled),
    "aot-eager": Backend("aot-eager", ("train",), lambda c: _build_compiled(c, backend="aot_eager")),
    "ort": Backend("ort", MODES, _build_ort, floor_of={"inference": "floor", "train": "aot-eager"}),
    "ort+freeze": Backend(
        "ort+freeze", ("inference",), lambda c: _build_ort(c, freeze=True), floor_of={"inference": "floor+freeze"}
    ),
    "floor": Backend("floor", ("inference",), _build_floor),
    "floor+freeze": Backend("floor+freeze", ("inference",), lambda c: _build_floor(c, freeze=True)),
    "best-ort": Backend("best-ort", ("inference",), _build_best_ort),
    "dynamo+best-ort": Backend("dynamo+best-ort", ("inference",), _build_dynamo_best_ort),
    "ort-int8": Backend(
        "ort-int8", ("inference",), lambda c: _build_ort(c, precision="int8-dynamic"), reduced=True, devices=("cpu",)
    ),
    "ort-fast": Backend("ort-fast", MODES, lambda c: _build_ort(c, fast_math=True), reduced=True),
    # ORT's CPU provider has no float16 matrix kernels (regions stay float32 there)
    "ort-fp16": Backend("ort-fp16", ("inference",), lambda c: _build_ort(c, precision="fp16"), reduced=True, devices=("cuda",)),
    "eager-mixed": Backend("eager-mixed", MODES, _mixed(_build_eager), alone="eager", devices=("cpu",)),
    "ort-mixed": Backend("ort-mixed", MODES, _mixed(_build_ort), alone="ort", devices=("cpu",)),
    **{name: row for provider in PROVIDERS for name, row in provider_rows(provider).items()},
}


def missing(name: str) -> str | None:
    """What the row ``name`` needs installed that is not (None: it can run here)."""
    return BACKENDS[name].needs()


def default_backends(device: str) -> list[str]:
    """The rows run without ``--backends``: those of :data:`DEFAULT_BACKENDS` measured on
    ``device``, on a GPU its reduced precision (``ort-fp16``), then the rows of each provider
    of :data:`PROVIDERS` measured on ``device`` whose provider (or peer package) is installed."""
    rows = [b for b in DEFAULT_BACKENDS if device in BACKENDS[b].devices]
    rows += ["ort-fp16"] if device == "cuda" else []
    for provider in PROVIDERS:
        rows += [name for name, row in provider_rows(provider).items() if device in row.devices and row.needs() is None]
    return rows


# ----------------------------------------------------------------------------- against eager


def _first(out: Any) -> Any:
    """A step's output, or its first element when it returns several."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _max_abs_diff(a: Any, b: Any) -> float | None:
    a, b = _first(a), _first(b)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return None
    diff = (a.detach().double() - b.detach().double()).abs()
    return float(diff.max()) if diff.numel() else 0.0


def check_against_eager(prepared: Mapping[str, Prepared], rows: Mapping[str, Row]) -> None:
    """Fill ``max_abs_diff`` and ``max_rel_diff`` of every built row but eager's: its first call's
    output (or first loss) against eager's, absolute and over eager's largest magnitude."""
    eager = prepared.get("eager")
    for name, p in prepared.items():
        if eager is not None and name != "eager":
            row = rows[name]
            row.max_abs_diff = _max_abs_diff(p.output, eager.output)
            reference = _first(eager.output)
            scale = _max_abs_diff(reference, torch.zeros_like(reference)) if isinstance(reference, torch.Tensor) else None
            if row.max_abs_diff is not None and scale:
                row.max_rel_diff = row.max_abs_diff / scale

"""The ORT floor: the exact ONNX graphs ort-lazy runs, executed directly by ORT with pre-bound I/O.

:func:`capture_regions` compiles a model with ``torch.compile(backend="ort")`` while recording
every ORT region ort-lazy creates (its ONNX model, the ORT session it built, and the inputs each
region receives on a steady-state call). :class:`FloorRunner` then replays those regions on fresh
ORT sessions with the same session options and providers, inputs and preallocated outputs bound
once through IOBinding, so one call is nothing but ``run_with_iobinding`` per region: the time
ORT itself needs for the graph, with no Python, PyTorch or binding work around it.

When ort-lazy cannot compile the model, :func:`export_floor` builds the floor from
``torch.onnx.export(..., dynamo=True)`` instead (reported as such).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

# the element types ort-lazy binds with (one table for both)
from ort_lazy.runtime.quirks import disabled_optimizers
from ort_lazy.runtime.session import NUMPY_TYPES

__all__ = ["CapturedCall", "FloorRunner", "capture_regions", "export_floor", "least_backend", "recording"]



@dataclasses.dataclass
class CapturedCall:
    """One region call seen on a steady-state run of the ort-lazy compiled model."""

    model_bytes: bytes
    input_names: list[str]
    output_names: list[str]
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    session: Any
    name: str
    #: tensors behind the model's external initializers (shared weights), by name
    initializers: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    #: how many of the last outputs are the model's check outputs
    checks: int = 0


@contextlib.contextmanager
def recording() -> Iterator[list[CapturedCall]]:
    """Record every ORT region call ort-lazy makes inside the block (in call order).

    Wraps ``OrtRunner.run`` on the class for the duration of the block, so regions compiled
    before the block (Dynamo reuses a graph compiled for the same backend and options) are
    recorded too. The library is restored on exit.
    """
    from ort_lazy.runtime.session import OrtRunner

    calls: list[CapturedCall] = []
    original = OrtRunner.run

    def run(self: Any, inputs: Sequence[Any]) -> list[torch.Tensor]:
        outs = original(self, inputs)
        calls.append(_snapshot(self, inputs, outs))
        return outs

    OrtRunner.run = run  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        OrtRunner.run = original  # type: ignore[method-assign]


def _snapshot(runner: Any, inputs: Sequence[Any], outs: Sequence[torch.Tensor]) -> CapturedCall:
    bound: list[torch.Tensor] = []
    for value, spec in zip(inputs, runner.model.input_specs):
        if isinstance(value, torch.Tensor):
            bound.append(value.detach().contiguous().clone())
        else:
            bound.append(torch.tensor(value, dtype=spec.dtype))
    return CapturedCall(
        model_bytes=runner.model.model_bytes,
        input_names=list(runner.model.input_names),
        output_names=list(runner.model.output_names),
        inputs=bound,
        # the model's check outputs (0-d flags after the values) are bound too: ORT computes them
        outputs=[torch.empty_like(o, memory_format=torch.contiguous_format) for o in outs]
        + [torch.empty((), dtype=torch.bool) for _ in range(getattr(runner.model, "checks", 0))],
        session=runner.session,
        name=runner.model.name,
        initializers=dict(getattr(runner, "initializers", {}) or {}),
        checks=getattr(runner.model, "checks", 0),
    )


class FloorRunner:
    """Replays captured region calls on ORT with inputs and outputs bound once.

    Args:
        calls: the region calls of one steady-state model call, in order.
        fresh_sessions: build new sessions from each region's ONNX bytes with the options and
            providers of the session ort-lazy created (``False`` reuses ort-lazy's sessions).
    """

    def __init__(self, calls: Sequence[CapturedCall], *, fresh_sessions: bool = True) -> None:
        if not calls:
            raise RuntimeError("no ORT region ran: nothing to build a floor from")
        import onnxruntime as ort

        self.calls = list(calls)
        self.sessions: list[Any] = []
        self.bindings: list[Any] = []
        for call in self.calls:
            sess = call.session
            if fresh_sessions and sess is not None:
                so = sess.get_session_options()
                if call.initializers:
                    # shared weights: the same memory ort-lazy's session reads
                    names = list(call.initializers)
                    so.add_external_initializers(names, [_ortvalue(call.initializers[n]) for n in names])
                sess = ort.InferenceSession(
                    _clamp_ir(call.model_bytes),
                    sess_options=so,
                    providers=sess.get_providers(),
                    provider_options=[sess.get_provider_options().get(p, {}) for p in sess.get_providers()],
                    disabled_optimizers=disabled_optimizers(call.model_bytes, sess.get_providers()),
                )
            binding = sess.io_binding()
            for name, tensor in zip(call.input_names, call.inputs):
                binding.bind_input(name, *_where(tensor), NUMPY_TYPES[tensor.dtype], list(tensor.shape), tensor.data_ptr())
            for name, tensor in zip(call.output_names, call.outputs):
                binding.bind_output(name, *_where(tensor), NUMPY_TYPES[tensor.dtype], list(tensor.shape), tensor.data_ptr())
            self.sessions.append(sess)
            self.bindings.append(binding)
        pairs = list(zip(self.sessions, self.bindings))
        if len(pairs) == 1:
            sess0, bind0 = pairs[0]
            self._call: Callable[[], None] = lambda: sess0.run_with_iobinding(bind0)
        else:

            def call_all() -> None:
                for sess, binding in pairs:
                    sess.run_with_iobinding(binding)

            self._call = call_all

    @property
    def regions(self) -> int:
        """Number of ORT region calls in one model call."""
        return len(self.calls)

    def outputs(self) -> list[torch.Tensor]:
        """The bound outputs of the last region (the model output when ORT runs the whole graph),
        its check outputs left out."""
        call = self.calls[-1]
        return call.outputs[: len(call.outputs) - call.checks]

    def __call__(self) -> None:
        self._call()


def _where(tensor: torch.Tensor) -> tuple[str, int]:
    """IOBinding's device name and index for ``tensor``."""
    if tensor.is_cuda:
        return "cuda", tensor.device.index or 0
    return "cpu", 0


def _ortvalue(tensor: torch.Tensor) -> Any:
    from ort_lazy.runtime import _ort

    return _ort.ortvalue_of(tensor)


def _clamp_ir(model_bytes: bytes) -> bytes:
    try:
        from ort_lazy.runtime.session_create import _clamp_ir_version
    except ImportError:  # pragma: no cover - older layouts
        try:
            from ort_lazy.runtime.session import _clamp_ir_version
        except ImportError:
            return model_bytes
    return _clamp_ir_version(model_bytes)


def capture_regions(
    model: torch.nn.Module, inputs: Sequence[torch.Tensor], options: dict[str, Any]
) -> list[CapturedCall]:
    """Compile ``model`` with the ort backend and record the region calls of its 2nd call.

    The model is called under ``torch.no_grad()`` (inference); the first call compiles, the
    second is the steady-state call that gets recorded.
    """
    compiled = torch.compile(model, backend="ort", options=dict(options))
    with torch.no_grad():
        compiled(*inputs)
        with recording() as calls:
            compiled(*inputs)
    return calls


def export_floor(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    threads: int,
    *,
    optimize: bool = False,
    default_options: bool = False,
    providers: Sequence[str] | None = None,
) -> FloorRunner:
    """``model`` exported by ``torch.onnx.export(dynamo=True)`` (weights as initializers) and run
    by ORT with inputs and outputs bound once.

    ``optimize``: run the exporter's optimizer. ``default_options``: ORT's default session
    options but ``threads`` (the best direct ORT run); otherwise the options ort-lazy uses.
    ``providers``: ORT's execution providers in priority order (ORT's names), each with ORT's
    default provider options; None: the CPU provider, after ORT's CUDA provider for inputs on
    a GPU.
    """
    import onnxruntime as ort

    with torch.no_grad():
        program = torch.onnx.export(model, tuple(inputs), dynamo=True, verbose=False, optimize=optimize)
        expected = model(*inputs)
    model_bytes = program.model_proto.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    if not default_options:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    chosen: list[Any] = list(providers) if providers is not None else ["CPUExecutionProvider"]
    if providers is None and inputs and inputs[0].is_cuda:
        # ORT's CUDA provider with its defaults, but TF32 as torch has it (torch: off by default)
        cuda = {"device_id": str(inputs[0].device.index or 0), "use_tf32": str(int(torch.backends.cuda.matmul.allow_tf32))}
        chosen.insert(0, ("CUDAExecutionProvider", cuda))
    sess = ort.InferenceSession(model_bytes, sess_options=so, providers=chosen)
    outs = expected if isinstance(expected, (tuple, list)) else [expected]
    call = CapturedCall(
        model_bytes=model_bytes,
        input_names=[i.name for i in sess.get_inputs()],
        output_names=[o.name for o in sess.get_outputs()],
        inputs=[t.detach().contiguous().clone() for t in inputs],
        outputs=[torch.empty_like(o) for o in outs],
        session=sess,
        name="torch.onnx.export",
    )
    return FloorRunner([call], fresh_sessions=False)


def least_backend(runner: FloorRunner, inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """A dynamo backend that does per call only what any backend running ORT must: bind the
    model's inputs (they may change between calls) and fresh outputs (a caller may keep the
    last ones), run the session of ``runner`` (one region: :func:`export_floor`'s), return.

    It reads nothing of the graph dynamo hands it but which graph inputs are the model's
    (``inputs``, by identity at the first call): ``torch.compile`` with it costs dynamo's own
    per-call work plus that binding, the least any ``torch.compile`` backend on ORT pays.
    """
    if runner.regions != 1:
        raise ValueError("the least backend runs one ORT session")
    call = runner.calls[0]
    sess = runner.sessions[0]
    binding = sess.io_binding()
    outs = [(name, *_where(t), NUMPY_TYPES[t.dtype], t.dtype, list(t.shape), t.device) for name, t in zip(call.output_names, call.outputs)]
    ins = [(name, *_where(t), NUMPY_TYPES[t.dtype], list(t.shape)) for name, t in zip(call.input_names, call.inputs)]
    if len(ins) != len(inputs):
        raise ValueError(f"the exported model takes {len(ins)} inputs, the model {len(inputs)}")

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        graph_outputs = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        if graph_outputs != len(outs):
            raise ValueError(f"dynamo's graph returns {graph_outputs} values, the exported model {len(outs)}")
        positions: list[int] = []

        def run(*args: Any) -> tuple[torch.Tensor, ...]:
            if not positions:
                positions.extend(next(i for i, a in enumerate(args) if a is x) for x in inputs)
            for (name, device, index, element_type, shape), i in zip(ins, positions):
                binding.bind_input(name, device, index, element_type, shape, args[i].data_ptr())
            results = []
            for name, device, index, element_type, dtype, shape, where in outs:
                out = torch.empty(shape, dtype=dtype, device=where)
                binding.bind_output(name, device, index, element_type, shape, out.data_ptr())
                results.append(out)
            sess.run_with_iobinding(binding)
            return tuple(results)

        return run

    return backend

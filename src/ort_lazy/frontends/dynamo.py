"""TorchDynamo front door: ``torch.compile(model, backend="ort")``.

Registered through the ``torch_dynamo_backends`` entry point, so no import is needed. Dynamo
captures the graph; :func:`ort_lazy.lowering.aten.compile_captured` lowers it to aten and hands
the pieces to ORT. Options are read when a graph is compiled, so ``ORT_LAZY_*`` variables set
after ``torch.compile`` but before the first call take effect.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..lowering.aten import compile_captured
from ..options import Options

__all__ = ["ort_backend", "make_backend", "compile"]


def _resolve(options: Options | Mapping[str, Any] | None) -> Options:
    if isinstance(options, Options):
        return options
    if options is not None and not isinstance(options, Mapping):
        from ..options import OptionsError

        raise OptionsError(
            f"options: expected a mapping of option names to values (or an ort_lazy.Options), got {type(options).__name__}"
        )
    return Options.from_env(**dict(options or {}))


def make_backend(options: Options | Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A dynamo backend callable bound to ``options`` (an :class:`Options` or a dict of fields).

    A mapping is validated at once and re-read with the environment at each compile.
    """
    _resolve(options)

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any) -> Callable[..., Any]:
        return compile_captured(gm, example_inputs, _resolve(options))

    return backend


def ort_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | Options | None = None
) -> Callable[..., Any]:
    """The ``ort`` dynamo backend: ``torch.compile(model, backend="ort", options={...})``."""
    return compile_captured(gm, example_inputs, _resolve(options))


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
    backend = functools.partial(ort_backend, options=options)
    return torch.compile(model, backend=backend, dynamic=torch_dynamic, fullgraph=fullgraph)

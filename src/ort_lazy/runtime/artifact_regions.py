"""Loaded regions: the ``ort_lazy::region`` op that stands for an ORT region in a saved program,
the registry of loaded regions it runs, :class:`LoadedRegion` (a region's runner and how the
op's arguments map to its model's inputs), the symbolic dims of its outputs and the weights'
tensors read from ``weights.bin``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..options import Options
from ..specs import dim_symbols, parse_dim
from .artifact_format import WEIGHTS, ArtifactError
from .region import open_runner
from .session import OrtRunner
from .threads import model_flops, thread_trial

__all__ = ["REGION_OP", "LoadedRegion", "dim_value"]

# -- the region op ------------------------------------------------------------------------------

_LIB = torch.library.Library("ort_lazy", "DEF")
_LIB.define("region(Tensor[] inputs, SymInt[] sizes, str region) -> Tensor[]")
#: the op standing for an ORT region in a saved program: ``inputs`` are the region's tensor
#: inputs, ``sizes`` its integer ones (symbolic sizes the graph computes), ``region`` the key of
#: the loaded region that runs it
REGION_OP = torch.ops.ort_lazy.region.default

_REGIONS: dict[str, LoadedRegion] = {}
_regions_lock = threading.Lock()


def _region(key: str) -> LoadedRegion:
    region = _REGIONS.get(key)
    if region is None:
        raise ArtifactError(
            f"ORT region {key!r} is not loaded: a program with ort_lazy::region calls runs through "
            "ort_lazy.load(path), which opens its regions"
        )
    return region


def _run_region(inputs: list[torch.Tensor], sizes: list[int], region: str) -> list[torch.Tensor]:
    return _region(region).run(inputs, sizes)


def _fake_region(inputs: list[torch.Tensor], sizes: list[Any], region: str) -> list[torch.Tensor]:
    """Outputs of the region's dtypes and shapes, symbolic dims computed from the inputs'
    sizes (fake tensors: re-tracing a loaded program keeps its dynamic dims)."""
    return _region(region).fake(inputs, sizes)


_LIB.impl("region", _run_region, "CompositeExplicitAutograd")
torch.library.register_fake("ort_lazy::region", _fake_region, lib=_LIB)


# -- symbolic dims --------------------------------------------------------------------------------


def dim_value(expr: str, symbols: Mapping[str, Any]) -> Any:
    """The value of a symbolic dim's expression (:func:`~ort_lazy.specs.parse_dim`) with
    ``symbols`` bound. Raises :class:`ArtifactError` for an expression it does not read or a
    symbol not bound."""
    try:
        return parse_dim(expr)(symbols)
    except ValueError as e:
        raise ArtifactError(str(e)) from None
    except KeyError as e:
        raise ArtifactError(f"dim {expr!r}: symbol {e.args[0]!r} is not among the region's input sizes") from None


def _symbols_of(dims: Sequence[Any]) -> set[str]:
    names: set[str] = set()
    for d in dims:
        if isinstance(d, str):
            try:
                names |= dim_symbols(d)
            except ValueError as e:
                raise ArtifactError(str(e)) from None
    return names


# -- loaded regions ---------------------------------------------------------------------------------


class LoadedRegion:
    """One region of a loaded artifact: its ORT runner and how the op's arguments map to the
    model's inputs. Loaded regions have no PyTorch twin: an ORT failure raises
    :class:`~ort_lazy.runtime.session_create.OrtRunError`, never a silent fallback."""

    def __init__(
        self, key: str, entry: Mapping[str, Any], runner: OrtRunner, options: Options | None = None,
        weights: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        self.key = key
        self.id = str(entry["id"])
        self.runner = runner
        self.options = options or runner.options
        self.weights = dict(weights or {})
        self.model = runner.model
        #: per model input: ("t", i) the op's i-th tensor, ("s", j) its j-th size
        self.arrangement: list[tuple[str, int]] = [(str(k), int(i)) for k, i in entry["arrangement"]]
        self.size_symbols: list[str | None] = [s if isinstance(s, str) else None for s in entry.get("size_symbols", [])]
        self.ops = list(entry.get("ops", []))
        specs = self.model.output_specs[: len(self.model.output_specs) - self.model.checks]
        self._outputs = specs
        # every output dim's expression parses, and reads only symbols the inputs bind
        known = _symbols_of([d for s in self.model.input_specs for d in s.shape] + [s for s in self.size_symbols if s])
        unknown = _symbols_of([d for s in specs for d in s.shape]) - known
        if unknown:
            raise ArtifactError(f"region {self.id}: output dims read symbols no input binds: {sorted(unknown)}")
        self._identity = all(k == "t" and i == n for n, (k, i) in enumerate(self.arrangement))

    def reopened(self, one_thread: bool) -> OrtRunner:
        """A runner of this region's model on one thread, or on PyTorch's count."""
        return open_runner(
            self.model, self.options, self.runner.device, spinning=self.runner.spinning, weights=self.weights, one_thread=one_thread
        )

    def plans_trial(self) -> bool:
        """Whether the region's thread count is worth a trial, as a compiled region's is
        (:func:`~ort_lazy.runtime.threads.thread_trial`): CPU, more than one PyTorch thread, no
        thread count in ``session_options``, work in the trial's range."""
        return (
            self.runner.device.type == "cpu"
            and torch.get_num_threads() >= 2
            and "intra_op_num_threads" not in self.options.session_options
            and thread_trial(model_flops(self.model))
        )

    def run(self, tensors: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        """The region's outputs for the op's arguments, computed by ORT."""
        if self._identity and not sizes:
            return self.runner.run(tensors)
        return self.runner.run([tensors[i] if k == "t" else sizes[i] for k, i in self.arrangement])

    def fake(self, tensors: Sequence[torch.Tensor], sizes: Sequence[Any]) -> list[torch.Tensor]:
        """Empty tensors of the outputs' dtypes and shapes for these (fake) inputs."""
        symbols: dict[str, Any] = {}
        for (kind, i), spec in zip(self.arrangement, self.model.input_specs):
            if kind == "t":
                for dim, value in zip(spec.shape, tensors[i].shape):
                    if isinstance(dim, str) and dim not in symbols:
                        symbols[dim] = value
            elif (symbol := self.size_symbols[i]) and symbol.isidentifier():
                symbols.setdefault(symbol, sizes[i])
        device = tensors[0].device if tensors else self.runner.device
        return [
            torch.empty([dim_value(d, symbols) if isinstance(d, str) else d for d in spec.shape], dtype=spec.dtype, device=device)
            for spec in self._outputs
        ]


def _weights_from(data: bytes, index: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of ``weights.bin`` (one writable copy of its bytes, which they view)."""
    if not index:
        return {}
    buffer = bytearray(data)
    out: dict[str, torch.Tensor] = {}
    for name, entry in index.items():
        dtype = getattr(torch, str(entry["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ArtifactError(f"weight {name}: unknown dtype {entry['dtype']!r}")
        shape = [int(d) for d in entry["shape"]]
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > len(buffer) or nbytes != math.prod(shape) * itemsize or offset % itemsize:
            raise ArtifactError(f"weight {name}: its bytes ({offset}+{nbytes}) do not fit {WEIGHTS} or its shape")
        if nbytes == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
        out[name] = flat.view(dtype).reshape(shape)
    return out

"""Export through the persistent compile cache (``cache_dir``): a warm process skips the exporter."""

from __future__ import annotations

import collections
import hashlib
import threading
from typing import Any

import torch
import torch.fx

from .. import _compat
from ..debug.nvtx import nvtx_range
from ..options import Options
from ..runtime.disk_cache import cache_key, disk_cache
from ..runtime.region import learn_facts
from ..specs import OrtModel, spec_to_json
from . import fx as _fx
from .fx import export_graph, spec_of

__all__ = ["cached_export", "clear_shared_models", "export_for", "graph_device"]


def graph_device(gm: torch.fx.GraphModule) -> torch.device:
    """The device of the graph's tensors: the first CUDA device seen, else CPU."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device
    return torch.device("cpu")


def cached_export(
    sub: torch.fx.GraphModule,
    name: str,
    options: Options,
    constants: dict[int, torch.Tensor] | None = None,
    shared: bool = False,
) -> OrtModel:
    """:func:`~ort_lazy.export.fx.export_graph`, through the compile cache when one is configured.

    Entries are keyed by the graph's code, its input specs, the constants' contents (their
    dtypes and shapes only when ``shared``: the model holds no data then), the options that
    change the model, the device type and whether CPU models take checked forms.
    """
    with nvtx_range(f"ort_lazy.export:{name}", options.nvtx):
        return _cached_export(sub, name, options, constants, shared)


#: models without weight data (``shared``) exported in this process without a disk cache, by
#: cache key: every module instance one graph serves (``lowering.aten._per_weight_set``) has
#: the same model
_SHARED_MODELS: collections.OrderedDict[str, tuple[bytes, Any]] = collections.OrderedDict()
_SHARED_MODELS_SIZE = 64
_shared_lock = threading.Lock()


def clear_shared_models() -> None:
    """Forget the models kept in this process (each is exported again when next needed)."""
    with _shared_lock:
        _SHARED_MODELS.clear()


def _cached_export(
    sub: torch.fx.GraphModule, name: str, options: Options, constants: dict[int, torch.Tensor] | None, shared: bool
) -> OrtModel:
    cache = disk_cache(options.cache_dir)
    device = graph_device(sub)
    if cache is None and not shared:
        return export_for(sub, name, options, constants, shared, device)
    specs = [spec_of(n.meta.get("val")) for n in sub.graph.nodes if n.op == "placeholder"]
    if shared:
        frozen = {str(i): [str(t.dtype), list(t.shape)] for i, t in (constants or {}).items()}
    else:
        frozen = {str(i): _tensor_digest(t) for i, t in (constants or {}).items()}
    key = cache_key(
        "region", sub.code, [spec_to_json(s) for s in specs], frozen, options.key(), device.type, shared,
        _fx.CHECKED_FORMS_ON_CPU,
    )
    if cache is None:  # shared: kept in this process (with a disk cache, the disk keeps it)
        with _shared_lock:
            known = _SHARED_MODELS.get(key)
            if known is not None:
                _SHARED_MODELS.move_to_end(key)
        if known is not None:
            return OrtModel.from_description(known[0], known[1], name)
        model = _exported(sub, name, options, constants, shared, device)
        with _shared_lock:
            _SHARED_MODELS[key] = (model.model_bytes, model.describe())
            while len(_SHARED_MODELS) > _SHARED_MODELS_SIZE:
                _SHARED_MODELS.popitem(last=False)
        return model
    hit = cache.get_model(key)
    if hit is not None:
        blob, data = hit
        try:
            return OrtModel.from_description(blob, data, name)
        except (KeyError, TypeError, ValueError):
            pass  # an entry of another layout: export again and overwrite it
    model = _exported(sub, name, options, constants, shared, device)
    cache.put_model(key, model.model_bytes, model.describe())
    return model


def _exported(
    sub: torch.fx.GraphModule,
    name: str,
    options: Options,
    constants: dict[int, torch.Tensor] | None,
    shared: bool,
    device: torch.device,
) -> OrtModel:
    """:func:`export_graph` for a model that is kept (on disk or in this process), with the
    facts a runner reads from it (:func:`~ort_lazy.runtime.region.learn_facts`), so the process
    that reuses it opens a session without parsing it."""
    model = export_for(sub, name, options, constants, shared, device)
    learn_facts(model, device)
    return model


def export_for(
    sub: torch.fx.GraphModule,
    name: str,
    options: Options,
    constants: dict[int, torch.Tensor] | None,
    shared: bool,
    device: torch.device,
    checked: bool = True,
) -> OrtModel:
    """:func:`export_graph` with what ``options`` say about the model: the providers for
    ``device``, ``precision`` and ``fast_math`` (no cache); ``checked``: see there."""
    return export_graph(
        sub, name, constants, options.resolve_providers(device), shared=shared, precision=options.precision,
        fast_math=options.fast_math, checked=checked,
    )


def _tensor_digest(t: torch.Tensor) -> str:
    with _compat.real_tensor_mode():
        data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()

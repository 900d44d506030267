"""TensorRT through ORT's ``TensorrtExecutionProvider``: the provider options ort-lazy computes.

TensorRT compiles the nodes it takes into engines; ORT's CUDA provider, after it in the list,
runs what TensorRT's parser refuses (``providers="tensorrt"`` means TensorRT, CUDA, CPU). A
session's TensorRT options are the user's (``provider_options={"tensorrt": {...}}``, which always
win) completed with ort-lazy's own (:func:`complete`), under ORT's option names
(``onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc``):

- **Engine cache** (``trt_engine_cache_enable``, ``trt_engine_cache_path``,
  ``trt_engine_cache_prefix``) and **timing cache** (``trt_timing_cache_enable``,
  ``trt_timing_cache_path``) in :func:`engine_cache_dir`: ``<cache_dir>/tensorrt`` with
  ``Options.cache_dir``, else ``$XDG_CACHE_HOME/ort-lazy/tensorrt`` (``~/.cache/ort-lazy/tensorrt``),
  a private folder (0700) per onnxruntime and TensorRT version. Building an engine takes seconds
  to minutes; a later process loads it. ORT names an engine from the graph's name and the names
  of its values, not their contents; ort-lazy's regions share names (``inference_fused_0``,
  ``arg0_1`` ...), so every engine gets a prefix of the model's SHA-256 and of the options it was
  built with (:func:`cache_prefix`): two models never share an engine file.
  ``trt_engine_cache_enable=0`` turns both caches off. No EPContext model is dumped
  (``trt_dump_ep_context_model``): it is an ONNX file to load in place of the model, and
  ort-lazy's models live in memory; the engine cache spares the same build.
- **Precision**: ``precision="fp16"`` sets ``trt_fp16_enable`` (with
  ``trt_layer_norm_fp32_fallback``: layer norms' powers and sums stay float32, as ort-lazy keeps
  them) for the models ort-lazy narrowed to float16 (inference regions holding the weights,
  :data:`FLOAT16_FACT`); training graphs keep their dtypes. TensorRT may then run any layer in
  float16. Without it TensorRT computes float32 products in TF32 where the GPU has it
  (TensorRT's default; ORT has no option to turn it off). ``int8-dynamic`` is refused with
  TensorRT (``Options``): ORT's dynamic int8 ops are not TensorRT's, whose own int8 needs a
  calibration table or a QDQ model.
- **Shape profiles** (``trt_profile_min_shapes``, ``trt_profile_opt_shapes``,
  ``trt_profile_max_shapes``; ``name:1x3x224x224,name2:...``) for models with symbolic dims
  (:class:`Profile`, :func:`profile_for`): per symbolic dim, min 1, opt the size of the call
  the session is built for, max ``Options.trt_profile_scale`` times that (2 by default); static
  dims are their size. A call outside the profile gets a session with a wider profile (opt its
  own sizes, max the larger of the old max and the scale times them), so a growing size costs a
  number of engine builds logarithmic in its growth; ORT would otherwise rebuild the engine for
  each new largest size. Giving any of the three options turns ort-lazy's profiles off.
- **Device and stream**: ``device_id``, ``has_user_compute_stream`` and ``user_compute_stream``
  as for CUDA (``ort_lazy.runtime.session_create.provider_options_for``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import hashlib
import importlib.metadata
import importlib.util
import math
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import metrics
from ..options import Options
from ..specs import OrtModel, TensorSpec
from .disk_cache import CacheDirError, make_private_dir
from .flavour import flavour, onnxruntime

__all__ = [
    "TRT",
    "CUDA",
    "PROFILE_OPTIONS",
    "FLOAT16_FACT",
    "ShapeRange",
    "Profile",
    "profiled_inputs",
    "call_shapes",
    "profile_for",
    "wants_profiles",
    "engine_cache_dir",
    "cache_prefix",
    "complete",
    "is_off",
    "library_problem",
    "usable_providers",
    "mark_unusable",
]

TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"

#: ORT's explicit shape-profile options; a user giving any of them manages profiles alone
PROFILE_OPTIONS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")

#: :attr:`OrtModel.facts` entry set by the exporter when ``precision="fp16"`` narrowed the model
FLOAT16_FACT = "float16_compute"

#: options that name where a session runs, not what its engine is: left out of
#: :func:`cache_prefix` (an engine serves every device of its GPU model, whatever the stream)
_PLACEMENT = frozenset(
    {"device_id", "has_user_compute_stream", "user_compute_stream", "trt_engine_cache_path", "trt_timing_cache_path",
     "trt_engine_cache_prefix"}
)

_FALSE = frozenset({"0", "false", "no", "off"})


def is_off(value: Any) -> bool:
    """Whether a provider option's value turns its switch off (``0``, ``false``, ``False`` ...)."""
    return str(value).strip().lower() in _FALSE


@dataclasses.dataclass(frozen=True)
class ShapeRange:
    """One input's shapes in a TensorRT optimization profile (static dims equal in all three)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def covers(self, shape: Sequence[int]) -> bool:
        """Whether ``shape`` lies within the range (same rank, every dim between min and max)."""
        return len(shape) == len(self.min) and all(lo <= n <= hi for lo, n, hi in zip(self.min, shape, self.max))


@dataclasses.dataclass(frozen=True)
class Profile:
    """A TensorRT optimization profile: the shape range of each input with symbolic dims."""

    ranges: tuple[ShapeRange, ...]

    def covers(self, shapes: Mapping[str, Sequence[int]]) -> bool:
        """Whether every profiled input's shape in ``shapes`` lies within its range."""
        return all(r.covers(shapes[r.name]) for r in self.ranges if r.name in shapes)

    def provider_options(self) -> dict[str, str]:
        """The profile as ORT's ``trt_profile_{min,opt,max}_shapes`` options."""

        def text(which: str) -> str:
            return ",".join(f"{r.name}:{'x'.join(str(d) for d in getattr(r, which))}" for r in self.ranges)

        return {f"trt_profile_{which}_shapes": text(which) for which in ("min", "opt", "max")}

    def describe(self) -> str:
        """``name [min..max, opt]`` per input, for messages."""
        return "; ".join(
            f"{r.name} {'x'.join(f'{lo}..{hi}' if lo != hi else str(lo) for lo, hi in zip(r.min, r.max))} "
            f"(opt {'x'.join(map(str, r.opt))})"
            for r in self.ranges
        )


def profiled_inputs(names: Sequence[str], specs: Sequence[TensorSpec]) -> tuple[tuple[int, str, TensorSpec], ...]:
    """``(position, name, spec)`` of the model inputs a profile describes: those with a symbolic
    dim. Empty when there are none, or when a name cannot be written in ORT's profile syntax
    (a ``,`` or ``:`` in it): TensorRT then takes the shapes of the calls as they come."""
    found = tuple((i, n, s) for i, (n, s) in enumerate(zip(names, specs)) if not s.static)
    if any("," in n or ":" in n for _, n, _ in found):
        return ()
    return found


def call_shapes(profiled: Sequence[tuple[int, str, TensorSpec]], inputs: Sequence[Any]) -> dict[str, tuple[int, ...]]:
    """The shapes of a call's profiled inputs, by input name."""
    out: dict[str, tuple[int, ...]] = {}
    for position, name, _ in profiled:
        shape = getattr(inputs[position], "shape", None)
        if shape is not None:
            out[name] = tuple(int(d) for d in shape)
    return out


def profile_for(
    profiled: Sequence[tuple[int, str, TensorSpec]],
    shapes: Mapping[str, Sequence[int]],
    scale: float,
    previous: Profile | None = None,
) -> Profile:
    """The profile of a session built for a call of these ``shapes``.

    Per symbolic dim: min 1 (or the call's size when smaller: an empty dim), opt the call's
    size, max ``ceil(scale * size)``; with a ``previous`` profile, min and max also cover its
    range (a profile only widens). Static dims are their size in all three.
    """
    before = {r.name: r for r in previous.ranges} if previous is not None else {}
    ranges = []
    for _, name, spec in profiled:
        if name not in shapes:
            continue
        shape = tuple(shapes[name])
        old = before.get(name)
        if old is not None and len(old.min) != len(shape):
            old = None
        lo, hi = [], []
        for d, (dim, n) in enumerate(zip(spec.shape, shape)):
            if isinstance(dim, int):
                lo.append(n)
                hi.append(n)
                continue
            lo.append(min(1, n) if old is None else min(old.min[d], n))
            top = max(n, math.ceil(n * scale))
            hi.append(top if old is None else max(old.max[d], top))
        ranges.append(ShapeRange(name, tuple(lo), shape, tuple(hi)))
    return Profile(tuple(ranges))


def wants_profiles(providers: Sequence[str], options: Options) -> bool:
    """Whether sessions for ``providers`` get ort-lazy's shape profiles: TensorRT is among them
    and the user gave none of :data:`PROFILE_OPTIONS`."""
    if TRT not in providers:
        return False
    mine = options.provider_options.get(TRT, {})
    return not any(k in mine for k in PROFILE_OPTIONS)


@functools.lru_cache(maxsize=1)
def _tensorrt_version() -> str | None:
    """TensorRT's version as its pip packages record it (None: not installed by pip)."""
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-cu13", "tensorrt-cu13-libs", "tensorrt-libs"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cache_root(options: Options) -> Path:
    if options.cache_dir:
        return Path(options.cache_dir).expanduser() / "tensorrt"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ort-lazy" / "tensorrt"


def _private_dir(path: str) -> str | None:
    try:
        make_private_dir(path)
    except (CacheDirError, OSError) as e:
        metrics.warn_once(f"trt-cache:{path}", "ort-lazy: TensorRT engines are not cached: %s", e)
        return None
    return path


def engine_cache_dir(options: Options) -> str | None:
    """The folder TensorRT engines and timing caches of ``options`` are kept in, made private
    (0700) if new: ``<cache_dir>/tensorrt``, else ``$XDG_CACHE_HOME/ort-lazy/tensorrt``, then a
    folder per onnxruntime (and, where pip installed it, TensorRT) version. None (warned once)
    when it cannot be made or is not safe (another user's, or writable by others)."""
    version = f"ort{onnxruntime().__version__}"
    trt = _tensorrt_version()
    if trt:
        version += f"-trt{trt}"
    return _private_dir(str(_cache_root(options) / version))


def cache_prefix(model: OrtModel, settings: Mapping[str, str]) -> str:
    """``trt_engine_cache_prefix`` for ``model``'s sessions with TensorRT options ``settings``:
    its SHA-256 and a hash of the options that shape the engine (precision, profile, builder
    options; not the device, stream or folders)."""
    shaping = sorted((k, str(v)) for k, v in settings.items() if k not in _PLACEMENT)
    digest = hashlib.sha256(repr(shaping).encode()).hexdigest()
    return f"ortlazy-{model.digest[:16]}-{digest[:8]}"


def complete(opts: dict[str, str], options: Options, model: OrtModel | None, profile: Profile | None) -> dict[str, str]:
    """``opts`` (the user's TensorRT options, strings) with ort-lazy's defaults added where the
    user set nothing: the caches, float16 and the shape ``profile`` (see the module's text).
    Without a ``model`` no engine cache is set up (an engine file needs the model's name)."""
    out = dict(opts)
    if options.precision == "fp16" and model is not None and model.facts.get(FLOAT16_FACT):
        out.setdefault("trt_fp16_enable", "1")
        out.setdefault("trt_layer_norm_fp32_fallback", "1")
    if profile is not None and not any(k in opts for k in PROFILE_OPTIONS):
        for k, v in profile.provider_options().items():
            out.setdefault(k, v)
    if model is not None and not is_off(out.get("trt_engine_cache_enable", "1")):
        folder = out.get("trt_engine_cache_path") or engine_cache_dir(options)
        if folder:
            out.setdefault("trt_engine_cache_enable", "1")
            out.setdefault("trt_engine_cache_path", folder)
            out.setdefault("trt_timing_cache_enable", "1")
            out.setdefault("trt_timing_cache_path", folder)
            out.setdefault("trt_engine_cache_prefix", cache_prefix(model, out))
    if "trt_engine_cache_prefix" in opts and not is_off(out.get("trt_engine_cache_enable", "0")):
        metrics.warn_once(
            "trt-prefix",
            "ort-lazy: trt_engine_cache_prefix=%r names every region's engines alike; ORT tells engines apart by "
            "value names only, which regions share: leave it unset to have one prefix per model",
            opts["trt_engine_cache_prefix"],
        )
    return out


# --------------------------------------------------------------------------- can it load

_unusable: dict[str, str] = {}
_lock = threading.Lock()


def mark_unusable(reason: str) -> None:
    """TensorRT could not be used in this process (ORT fell back without it): later sessions
    are made without it, warned about once."""
    with _lock:
        _unusable.setdefault(TRT, reason)
    metrics.warn_once(
        "trt-unusable",
        "ort-lazy: TensorRT cannot run here (%s); sessions run on the other providers of the list",
        reason,
    )


def usable_providers(providers: Sequence[str]) -> tuple[str, ...]:
    """``providers`` without TensorRT once it was found unusable (:func:`mark_unusable`)."""
    with _lock:
        dropped = set(_unusable)
    kept = tuple(p for p in providers if p not in dropped)
    return kept or tuple(providers)


def _library_names() -> list[str]:
    """Where libnvinfer may be: pip's ``tensorrt_libs`` package, onnxruntime's own folder, then
    the loader's search path."""
    if sys.platform == "win32":
        patterns, sonames = ["nvinfer*.dll"], ["nvinfer_10.dll", "nvinfer.dll"]
    else:
        patterns, sonames = ["libnvinfer.so*"], ["libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so"]
    folders = []
    spec = importlib.util.find_spec("tensorrt_libs")
    if spec is not None and spec.submodule_search_locations:
        folders.extend(spec.submodule_search_locations)
    try:
        folders.append(os.path.join(os.path.dirname(onnxruntime().__file__), "capi"))
    except ImportError:
        pass
    found = [f for folder in folders for pattern in patterns for f in sorted(glob.glob(os.path.join(folder, pattern)))]
    return [f for f in found if "plugin" not in os.path.basename(f) and "lean" not in os.path.basename(f)] + sonames


def library_problem() -> str | None:
    """Why ORT's TensorRT provider cannot run in this process (not in the installed onnxruntime,
    or TensorRT's ``libnvinfer`` does not load), or None. ``onnxruntime-gpu`` lists the provider
    whether or not TensorRT is installed; without it ORT falls back to CUDA at session creation."""
    ort = onnxruntime()
    available = list(ort.get_available_providers())
    if TRT not in available:
        return f"{TRT} is not in the installed onnxruntime ({flavour()} {ort.__version__}; providers: {', '.join(available)})"
    errors = []
    for name in _library_names():
        try:
            ctypes.CDLL(name)
            return None
        except OSError as e:
            errors.append(str(e))
    return (
        f"TensorRT's libnvinfer does not load ({errors[-1] if errors else 'not found'}); install TensorRT "
        "(`pip install tensorrt-cu12`, or NVIDIA's packages) and put its lib folder on LD_LIBRARY_PATH"
    )

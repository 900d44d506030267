"""Options as every front door takes them, checked the same way.

:class:`~ort_lazy.options.Options` checks each value when made; here the front doors add what
depends on the installation: the execution providers asked for must be in the installed
onnxruntime flavour (``ORT_LAZY_PROVIDERS=cuda`` with the CPU build is an error saying how to get
the CUDA one, not a graph whose every op falls back).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .. import metrics
from ..options import Options, OptionsError
from ..runtime import providers as eps
from ..runtime.flavour import onnxruntime, provider_problem

__all__ = ["resolve_options"]


def resolve_options(options: Options | Mapping[str, Any] | None = None, /, **overrides: Any) -> Options:
    """The options a front door runs with.

    ``options`` is an :class:`Options` (used as is, ``overrides`` applied), a mapping of option
    names to values or None (then ``ORT_LAZY_*`` variables, the mapping, then ``overrides``).
    An ``options=`` keyword among ``overrides`` is taken as ``options`` (``ort_lazy.compile(model,
    options={...})`` as with ``torch.compile``).

    Raises:
        OptionsError: ``options`` is neither, a value is invalid, or a provider asked for is not
            in the installed onnxruntime.
    """
    if "options" in overrides:
        if options is not None:
            raise OptionsError("options given twice")
        options = overrides.pop("options")
    if isinstance(options, Options):
        opts = options.replace(**overrides) if overrides else options
    elif options is None or isinstance(options, Mapping):
        opts = Options.from_env(**{**dict(options or {}), **overrides})
    else:
        raise OptionsError(
            f"options: expected a mapping of option names to values (or an ort_lazy.Options), "
            f"got {type(options).__name__} {options!r:.80}; e.g. options={{'min_block_size': 2}}"
        )
    return _with_installed_providers(opts)


def _with_installed_providers(opts: Options) -> Options:
    """``opts`` checked against the installation: plugin libraries registered (their providers
    the default list), every provider asked for present (in the flavour, or as a device of the
    EP device API). Raises :class:`OptionsError` saying how to get what is missing."""
    if opts.ep_libraries:
        names = list(eps.register_libraries(opts.ep_libraries))
        if opts.providers is None:
            opts = opts.replace(providers=(*names, eps.CPU))
    elif opts.ep_policy and opts.providers is None:
        # ORT picks among every provider it lists devices for: the region must suit them all
        listed = dict.fromkeys(d.ep_name for d in onnxruntime().get_ep_devices() if d.ep_name != eps.CPU)
        opts = opts.replace(providers=(*listed, eps.CPU))
    if opts.providers is None:
        return opts
    if opts.dynamic and eps.region_form(opts.providers).static_shapes:
        # regions get one model per input shape (the region's per-shape models)
        static = [p for p in opts.providers if eps.traits_of(p).static_shapes]
        metrics.warn_once(
            f"static-shapes:{opts.providers}",
            "ort-lazy: %s compile(s) for fixed shapes: each input shape gets its own model",
            ", ".join(static),
            level=logging.INFO,
        )
        opts = opts.replace(dynamic=False)
    if eps.uses_device_api(opts):
        problem = eps.device_problem(opts, opts.providers)
    else:
        problem = provider_problem(opts.providers)
    if problem is not None:
        raise OptionsError(f"providers: {problem}")
    return opts

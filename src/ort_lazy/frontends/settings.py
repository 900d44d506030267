"""Options as every front door takes them, checked the same way.

:class:`~ort_lazy.options.Options` checks each value when made; here the front doors add what
depends on the installation: the execution providers asked for must be in the installed
onnxruntime flavour (``ORT_LAZY_PROVIDERS=cuda`` with the CPU build is an error saying how to get
the CUDA one, not a graph whose every op falls back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..options import Options, OptionsError
from ..runtime.flavour import provider_problem

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
    if opts.providers is not None:
        problem = provider_problem(opts.providers)
        if problem is not None:
            raise OptionsError(f"providers: {problem}")
    return opts

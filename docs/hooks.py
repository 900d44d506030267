"""mkdocs hooks: the parts of the site generated from the code at build time.

A page holds a marker, ``<!-- generated: NAME -->`` on a line of its own, which the build
replaces by the Markdown of :data:`GENERATORS` ``[NAME]``:

- ``options-table`` / ``options-details``: the options reference, from the
  :class:`ort_lazy.options.Options` dataclass (``dataclasses.fields``: name, type, default;
  the field docstrings from the class docstring's ``Attributes:`` section; the
  ``ORT_LAZY_<FIELD>`` variable of each);
- ``env-variables``: the ``ORT_LAZY_*`` variables that are not fields (``options.ENV_VARIABLES``);
- ``accepted-values``: the value sets options accept (``PRECISIONS``, ``RUN_TYPES`` ...), each
  with its ``#:`` comment from ``options.py``;
- ``provider-names``: the short provider names (``options.PROVIDER_ALIASES``);
- ``onnxrt-options``: what becomes of each option of PyTorch's removed ``onnxrt`` backend
  (``ort_lazy.frontends.onnxrt.LEGACY_OPTIONS``);
- ``fallback-reasons``: every :class:`ort_lazy.reasons.Reason` with the fix
  :func:`ort_lazy.reasons.suggestion` gives for it.

The benchmark charts (``benchmarks/results/*.png``) are added to the site as ``img/<name>``.
``tests/test_docs.py`` imports this module to check the generated text as well.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    # the repository's own sources, as `pip install -e .` would give them
    sys.path.insert(0, str(ROOT / "src"))

from ort_lazy import options as _options  # noqa: E402
from ort_lazy import reasons as _reasons  # noqa: E402

#: ``<!-- generated: NAME -->`` on a line of its own
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->[ \t]*$", re.MULTILINE)
#: the benchmark charts the performance page shows
CHARTS = sorted((ROOT / "benchmarks" / "results").glob("*.png"))


# --------------------------------------------------------------------------- docstrings


def rst_to_markdown(text: str) -> str:
    """Sphinx-flavoured reST of a docstring (````code````, ``:data:`X```) as Markdown."""
    text = re.sub(r":(?:data|class|func|meth|attr|mod):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def attribute_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of ``cls``'s (Google-style) docstring: name -> text, the
    continuation lines joined."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    out: dict[str, str] = {}
    name = None
    indent = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width < indent:
            break  # the section ended
        entry = re.match(r"(\w+): (.*)", line.strip()) if width == indent else None
        if entry:
            name = entry.group(1)
            out[name] = entry.group(2)
        elif name is not None:
            out[name] += " " + line.strip()
    return out


def constant_comments(module: Any) -> dict[str, str]:
    """The ``#:`` comments written right above module-level assignments: name -> text."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names:
            continue
        comment: list[str] = []
        i = node.lineno - 2
        while i >= 0 and lines[i].lstrip().startswith("#:"):
            comment.insert(0, lines[i].lstrip()[2:].strip())
            i -= 1
        if comment:
            out[names[0]] = " ".join(comment)
    return out


def first_sentence(text: str) -> str:
    """``text`` up to its first full stop followed by a space (or all of it)."""
    match = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", text)
    return text[: match.start() + 1] if match else text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- options


def format_default(field: dataclasses.Field) -> str:
    """A field's default as Markdown, as a user would write it."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:  # pragma: no cover - every option has a default
        return "(required)"
    if value is None:
        return "unset"
    if isinstance(value, (frozenset, set, tuple, list)):
        return ", ".join(f"`{v}`" for v in sorted(value)) if value else "none"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value!r}`"
    return f"`{value}`"


def env_variable(name: str) -> str:
    """The ``ORT_LAZY_*`` variable of an option."""
    return _options.ENV_PREFIX + name.upper()


def option_fields() -> list[dataclasses.Field]:
    """The fields of :class:`~ort_lazy.options.Options`, in their order."""
    return list(dataclasses.fields(_options.Options))


def options_table() -> str:
    """One row per option: name (a link to its section), variable, default, first sentence."""
    docs = attribute_docs(_options.Options)
    rows = ["| option | environment variable | default | what it does |", "|---|---|---|---|"]
    for f in option_fields():
        summary = _capitalized(first_sentence(rst_to_markdown(docs.get(f.name, ""))))
        rows.append(f"| [`{f.name}`](#{f.name}) | `{env_variable(f.name)}` | {_cell(format_default(f))} | {_cell(summary)} |")
    return "\n".join(rows)


def options_details() -> str:
    """A section per option: its type, variable, default and whole docstring."""
    docs = attribute_docs(_options.Options)
    parts = []
    for f in option_fields():
        parts.append(
            f"### `{f.name}` {{#{f.name}}}\n\n"
            f"Type `{f.type}` · environment `{env_variable(f.name)}` · default {format_default(f)}\n\n"
            f"{_capitalized(rst_to_markdown(docs.get(f.name, '')))}\n"
        )
    return "\n".join(parts)


def env_variables() -> str:
    """The ``ORT_LAZY_*`` variables that are not options."""
    rows = ["| variable | what reads it |", "|---|---|"]
    for name, text in _options.ENV_VARIABLES.items():
        rows.append(f"| `{name}` | {_cell(text)} |")
    return "\n".join(rows)


#: the value sets the options page lists, with the option that takes each
ACCEPTED = {
    "PRECISIONS": "precision",
    "RUN_TYPES": "run_type",
    "DEVICE_TYPES": "ep_device",
    "EP_POLICIES": "ep_policy",
    "TORCH_PREFERRED_OPS": "torch_preferred_ops",
    "KNOWN_PROVIDERS": "providers",
}


def accepted_values() -> str:
    """Each value set of :data:`ACCEPTED`: its values and its ``#:`` comment."""
    comments = constant_comments(_options)
    parts = []
    for name, option in ACCEPTED.items():
        values = getattr(_options, name)
        listed = ", ".join(f"`{v}`" for v in (sorted(values) if isinstance(values, frozenset) else values))
        parts.append(
            f"**`{name}`** ([`{option}`](#{option})): {listed}\n\n{rst_to_markdown(comments.get(name, ''))}\n"
        )
    return "\n".join(parts)


def provider_names() -> str:
    """Short name -> ORT's provider name."""
    by_provider: dict[str, list[str]] = {}
    for short, full in _options.PROVIDER_ALIASES.items():
        by_provider.setdefault(full, []).append(short)
    rows = ["| short names | ORT's name |", "|---|---|"]
    for full in _options.KNOWN_PROVIDERS:
        shorts = ", ".join(f"`{s}`" for s in by_provider.get(full, []))
        rows.append(f"| {shorts or '-'} | `{full}` |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- the onnxrt name


def source_constant(path: Path, name: str) -> Any:
    """The literal value of the module-level constant ``name`` in the Python file ``path``, read
    without importing it (``frontends/onnxrt.py`` imports torch: the site builds without it)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return ast.literal_eval(node.value)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{path}: no constant {name}")


def onnxrt_options() -> str:
    """Each field of the removed backend's ``OrtBackendOptions`` and what ort-lazy does with it
    (``ort_lazy.frontends.onnxrt.LEGACY_OPTIONS``)."""
    legacy = source_constant(ROOT / "src" / "ort_lazy" / "frontends" / "onnxrt.py", "LEGACY_OPTIONS")
    rows = ["| `OrtBackendOptions` field | in ort-lazy |", "|---|---|"]
    for name, text in legacy.items():
        rows.append(f"| `{name}` | {_cell(text)} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- reasons


def reasons() -> list[tuple[str, str]]:
    """``(attribute, reason string)`` of every :class:`~ort_lazy.reasons.Reason`, in order."""
    return [(k, v) for k, v in vars(_reasons.Reason).items() if k.isupper() and isinstance(v, str)]


def fallback_reasons() -> str:
    """Every fallback reason as metrics and ``explain`` show it, with its suggested fix."""
    rows = ["| reason (as `explain` and the metrics show it) | what to do |", "|---|---|"]
    for _, text in reasons():
        fix = _reasons.suggestion(text) or "-"
        rows.append(f"| {_cell(text)} | {_cell(fix)} |")
    return "\n".join(rows)


#: marker name -> the Markdown it becomes
GENERATORS: dict[str, Callable[[], str]] = {
    "options-table": options_table,
    "options-details": options_details,
    "env-variables": env_variables,
    "accepted-values": accepted_values,
    "provider-names": provider_names,
    "fallback-reasons": fallback_reasons,
    "onnxrt-options": onnxrt_options,
}


def expand(markdown: str, where: str = "") -> str:
    """``markdown`` with every marker replaced by its generated text.

    Raises:
        KeyError: a marker names no generator.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"{where}: unknown generated section {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


# --------------------------------------------------------------------------- mkdocs events


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs: replace the markers of a page."""
    return expand(markdown, page.file.src_uri)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs: add the benchmark charts as ``img/<name>.png``."""
    from mkdocs.structure.files import File

    for chart in CHARTS:
        files.append(File.generated(config, f"img/{chart.name}", abs_src_path=str(chart)))
    return files

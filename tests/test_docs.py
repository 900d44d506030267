"""Docs that cannot rot: the site builds with warnings as errors, and every Python block of
``docs/`` and ``README.md`` runs.

A page's ```` ```python ```` blocks run in order in one namespace (a block may use what an
earlier block of the same page defined), on a fresh dynamo and zeroed metrics. An HTML comment
on the line right before a block says how it is run, always with a reason:

- ``<!-- not run: REASON -->``: never here (``REASON``: what it needs, e.g. a CUDA GPU);
- ``<!-- full tier: REASON -->``: only in the full tier (``--full-tier``; ``REASON``: why it is
  slow);
- ``<!-- needs: bridge -->``: only where the compiled LazyTensor/TorchScript bridge loads.

The generated parts of the site (``docs/hooks.py``) are checked against their sources too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import linecache
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]

#: an opening fence: its indent, its backticks or tildes, its language
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
#: a comment that says how the next block runs
MARK = re.compile(r"^\s*<!--\s*(?P<kind>not run|full tier|needs)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")
#: what ``needs:`` may name
NEEDS = {"bridge"}


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    kind: str | None = None  # "not run", "full tier", "needs" or None
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced ```` ```python ```` blocks of ``page`` with the comment before each.

    Raises:
        ValueError: a marker without a reason, naming an unknown need, or a fence left open.
    """
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.group("indent", "fence", "lang")
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(fence[0])),
            None,
        )
        if end is None:
            raise ValueError(f"{page.relative_to(ROOT)}:{i + 1}: a fence that is never closed")
        if lang in ("python", "py"):
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = MARK.match(before)
            kind, reason = (mark.group("kind"), (mark.group("reason") or "").strip()) if mark else (None, "")
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            if mark and not reason:
                raise ValueError(f"{where}: `<!-- {kind}: ... -->` needs a reason after the colon")
            if kind == "needs" and reason not in NEEDS:
                raise ValueError(f"{where}: `<!-- needs: {reason} -->`: known needs are {sorted(NEEDS)}")
            out.append(Block(page, i + 1, textwrap.dedent("\n".join(body)) + "\n", kind, reason))
        i = end + 1
    return out


def _runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(b.kind != "not run" for b in blocks(p))]


def test_every_page_parses_and_marks_carry_reasons() -> None:
    found = [b for page in PAGES for b in blocks(page)]
    assert len(found) >= 20, "the docs' Python examples were not found"
    marks = re.compile(r"<!--\s*(not run|full tier|needs)\b")
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("<!--") and marks.search(line):
                assert MARK.match(line), f"{page.relative_to(ROOT)}:{n}: write the mark as `<!-- KIND: reason -->`"


def _bridge_error() -> str | None:
    try:
        from ort_lazy.frontends import jit

        jit.load_bridge()
    except Exception as e:  # not built, or built for another torch
        return str(e)
    return None


def _run(block: Block, namespace: dict[str, Any]) -> None:
    """Run ``block`` in ``namespace``; its source is registered so that ``inspect`` (and so
    ``torch.jit.script``) can read it, and a traceback names the page and line."""
    filename = f"<{block.where}>"
    linecache.cache[filename] = (len(block.code), None, block.code.splitlines(True), filename)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, filename, "exec"), namespace)
    except Exception as e:
        raise AssertionError(f"the block at {block.where} failed: {type(e).__name__}: {e}\n{out.getvalue()}") from e


def _turn_front_doors_off() -> None:
    """What a page turned on (``ort_lazy.lazy.init()``, ``ort_lazy.jit.enable()``) is turned
    off: the pass stays on for later tests of the worker otherwise."""
    from ort_lazy.runtime import bridge

    if "lazy" in bridge.users():
        import ort_lazy.lazy

        ort_lazy.lazy.shutdown()
    if "jit" in bridge.users():
        import ort_lazy.jit

        ort_lazy.jit.disable()


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: Path, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.chdir(tmp_path)  # what an example writes lands in a folder of its own
    full_tier = request.config.getoption("--full-tier")
    torch._dynamo.reset()
    torch.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    skipped = []
    try:
        for block in blocks(page):
            if block.kind == "not run" or (block.kind == "full tier" and not full_tier):
                skipped.append(f"{block.where} ({block.kind}: {block.reason})")
                continue
            if block.kind == "needs" and _bridge_error() is not None:
                skipped.append(f"{block.where} (needs the bridge: {_bridge_error()})")
                continue
            _run(block, namespace)
    finally:
        torch._dynamo.reset()
        _turn_front_doors_off()
    if skipped and all(b.kind is not None for b in blocks(page)):
        pytest.skip("; ".join(skipped))


# --------------------------------------------------------------------------- the generated parts


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ort_lazy_docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_option_is_documented_in_the_reference() -> None:
    from ort_lazy.options import ENV_VARIABLES, Options

    hooks = _hooks()
    docs = hooks.attribute_docs(Options)
    fields = [f.name for f in dataclasses.fields(Options)]
    assert sorted(docs) == sorted(fields), "every Options field needs an entry in the docstring's Attributes"
    table, details = hooks.options_table(), hooks.options_details()
    for name in fields:
        assert f"`ORT_LAZY_{name.upper()}`" in table and f"### `{name}`" in details
    assert all(f"`{name}`" in hooks.env_variables() for name in ENV_VARIABLES)
    assert "`aten.convolution_backward`" in table  # a default set, spelled out
    assert ":data:" not in details and "``" not in details


def test_every_fallback_reason_is_listed_with_its_fix() -> None:
    from ort_lazy.reasons import Reason, suggestion

    hooks = _hooks()
    text = hooks.fallback_reasons()
    for name, reason in hooks.reasons():
        assert reason == getattr(Reason, name) and reason.replace("|", "\\|") in text
        assert suggestion(reason), f"Reason.{name} has no suggested fix in reasons.SUGGESTIONS"


def test_the_onnxrt_table_is_the_backends_own() -> None:
    from ort_lazy.frontends.onnxrt import LEGACY_OPTIONS, OrtBackendOptions

    text = _hooks().onnxrt_options()
    assert [f.name for f in dataclasses.fields(OrtBackendOptions)] == list(LEGACY_OPTIONS)
    assert all(f"`{name}`" in text for name in LEGACY_OPTIONS)


def test_every_counter_is_documented() -> None:
    from ort_lazy import metrics

    page = (DOCS / "what-runs-where.md").read_text(encoding="utf-8")
    missing = [name for name in metrics.counters() if f"`{name}`" not in page]
    assert not missing, f"counters missing from docs/what-runs-where.md: {missing}"


def test_markers_name_known_generators() -> None:
    hooks = _hooks()
    for page in DOCS.rglob("*.md"):
        for name in hooks.MARKER.findall(page.read_text(encoding="utf-8")):
            assert name in hooks.GENERATORS, f"{page.relative_to(ROOT)}: unknown generated section {name!r}"


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which is not there"


# --------------------------------------------------------------------------- the site


def test_site_builds_strict_and_offline(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is a test dependency (build.py installs it)")
    pytest.importorskip("material", reason="mkdocs-material is a test dependency (build.py installs it)")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's banner about its successor
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {p.relative_to(site).as_posix(): p.read_text(encoding="utf-8") for p in site.rglob("*.html")}
    for page, html in pages.items():
        # nothing fetched from elsewhere when the site is read: no web fonts, scripts or styles
        remote = re.findall(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//[^\"]*\"", html)
        assert not remote, (page, remote)
        assert "<!-- generated:" not in html, f"{page}: a generated section was not filled in"
    options = pages["options.html"]
    assert "ORT_LAZY_MIN_BLOCK_SIZE" in options and "ORT_LAZY_METRICS_FILE" in options
    assert "no ONNX mapping for this op" in pages["what-runs-where.html"]
    assert (site / "img" / "suite.png").is_file() and "img/suite.png" in pages["performance.html"]

"""The code keeps its shape: the layer contract in pyproject.toml holds and no import circle exists.

Imports inside functions count: a circle deferred to call time is still a circle in the design.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grimp
import importlinter.cli as importlinter_cli

ROOT = Path(__file__).resolve().parents[1]


def _import_circles(graph: object, package: str) -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), the package root left out."""
    modules = sorted(m for m in graph.modules if m != package)  # type: ignore[attr-defined]
    edges = {m: sorted(x for x in graph.find_modules_directly_imported_by(m) if x in modules) for m in modules}  # type: ignore[attr-defined]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in edges[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                group.append(n)
                if n == m:
                    break
            if len(group) > 1 or m in edges[m]:
                circles.append(sorted(group))

    for m in modules:
        if m not in index:
            visit(m)
    return circles


def test_no_import_circles() -> None:
    graph = grimp.build_graph("ort_lazy")
    assert _import_circles(graph, "ort_lazy") == []


def test_circle_finder_finds_a_circle() -> None:
    class Graph:
        modules = {"p", "p.a", "p.b", "p.c"}

        @staticmethod
        def find_modules_directly_imported_by(m: str) -> set[str]:
            return {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}.get(m, set())

    assert _import_circles(Graph(), "p") == [["p.a", "p.b"]]


def test_layer_contract_is_kept() -> None:
    # lint_imports configures logging with dictConfig, which disables every logger that exists
    # (ort_lazy's warnings would vanish for the rest of this pytest worker): put them back
    loggers = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    disabled = {lg: lg.disabled for lg in loggers}
    try:
        code = importlinter_cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        for lg, was in disabled.items():
            lg.disabled = was
    assert code == 0, "a module imports from a layer above its own (run `lint-imports` for details)"


#: the most lines a module of ``src/ort_lazy`` may have: past it, split it by topic into sibling
#: modules (their public names re-exported where they were imported from)
MAX_MODULE_LINES = 800
#: modules allowed past :data:`MAX_MODULE_LINES`, by path under ``src/ort_lazy``, each a generated
#: table, with the reason. None today: the special functions' coefficient tables
#: (``lowering/special_coefficients.py``) are kept by hand and well within the bound.
LONG_MODULES: dict[str, str] = {}


def _long_modules(package: Path, limit: int, allowed: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """The modules under ``package`` past ``limit`` lines that ``allowed`` does not name (with
    their line counts), and the names in ``allowed`` that are no module past it (to drop)."""
    counts = {p.relative_to(package).as_posix(): len(p.read_text().splitlines()) for p in sorted(package.rglob("*.py"))}
    long = {name: n for name, n in counts.items() if n > limit and name not in allowed}
    stale = sorted(name for name in allowed if counts.get(name, 0) <= limit)
    return long, stale


def test_modules_stay_within_the_line_bound() -> None:
    long, stale = _long_modules(ROOT / "src" / "ort_lazy", MAX_MODULE_LINES, LONG_MODULES)
    assert long == {}, f"modules past {MAX_MODULE_LINES} lines (split each by topic): {long}"
    assert stale == [], f"LONG_MODULES names modules within the bound (or gone): {stale}"


def test_line_bound_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "short.py").write_text("x = 1\n" * 3)
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * 5)
    (tmp_path / "table.py").write_text("x = 1\n" * 5)
    allowed = {"table.py": "generated", "short.py": "generated once"}
    assert _long_modules(tmp_path, 4, allowed) == ({"sub/long.py": 5}, ["short.py"])

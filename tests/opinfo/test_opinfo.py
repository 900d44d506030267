"""PyTorch's OpInfo database through ``torch.compile(fn, backend="ort")``, against eager.

Every case must keep the status recorded in ``expectations.tsv``: a case that turns wrong or
crashes fails, and so does one that silently moves from ORT to PyTorch (or the other way:
then regenerate the table). See ``harness.py`` for what a case runs and compares, ``table.py``
for the table, and ``docs/COVERAGE.md`` (``python tests/opinfo/coverage.py``) for the summary.

    pytest tests/opinfo                                   # fast subset (the default)
    pytest tests/opinfo --opinfo=full -n 2                # every case (as --full-tier runs it)
    pytest tests/opinfo --opinfo=full --shards 4 --shard 1
    pytest tests/opinfo --opinfo=full --opinfo-update -n 1   # rewrite the table from the run

Other onnxruntime flavours and providers are checked against the main table overlaid with their
own (``expectations-<flavour>.tsv``, the cases that differ; see ``table.py``); the flavour is
detected (``--opinfo-flavour`` names it)::

    ORT_LAZY_PROVIDERS=openvino,cpu pytest tests/opinfo          # on onnxruntime-openvino
    pytest tests/opinfo                                          # on onnxruntime-training
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from . import harness, plugin
from .table import Entry, Key, kind, matches, read_expectations, table_status

_TABLES: dict[str, dict[Key, Entry]] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    mode = plugin.mode(metafunc.config)
    cases = [] if mode == "off" else harness.all_cases(mode, plugin.flavour(metafunc.config))
    metafunc.parametrize("case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """OpInfo samples are tiny: one PyTorch (and so ORT) thread per worker, no oversubscription
    when pytest-xdist runs a worker per core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _table(config: pytest.Config) -> dict[Key, Entry]:
    path = config.getoption("--opinfo-table")
    if path not in _TABLES:
        _TABLES[path] = read_expectations(plugin.flavour(config), Path(path))
    return _TABLES[path]


def _explain(expected: str, observed: str, details: list[str]) -> str:
    update = "if this is intended, regenerate the table: pytest tests/opinfo --opinfo=full --opinfo-update"
    if kind(observed) in ("wrong", "crash"):
        head = f"turned {kind(observed)}: {observed} (expected {expected})"
    elif expected == "ort":
        head = f"moved from ORT to PyTorch: {observed}; {update}"
    elif observed == "ort":
        head = f"now runs on ORT (expected {expected}); {update}"
    else:
        head = f"status changed: expected {expected!r}, got {observed!r}; {update}"
    return "\n".join([head, *("  sample " + d for d in details)])


def test_opinfo(case: harness.Case, request: pytest.FixtureRequest) -> None:
    config = request.config
    samples = plugin.samples(config)
    result = harness.run_case(case, samples=samples, timeout=config.getoption("--opinfo-timeout"))
    record = {"op": case.op, "dtype": case.dtype, "direction": case.direction, **result.record()}
    request.node.user_properties.append(("opinfo", record))
    observed = result.status
    if kind(observed) == "skip":
        pytest.skip(observed)
    if config.getoption("--opinfo-update"):
        if kind(observed) in ("wrong", "crash"):
            pytest.xfail(observed)
        return
    entry = _table(config).get(case.key)
    if entry is None:
        pytest.fail(
            f"no expectation for {case.op} {case.dtype} {case.direction} (observed {table_status(observed)!r}): "
            f"add it with pytest tests/opinfo --opinfo=full --opinfo-update ({plugin.flavour(config)} flavour)",
            pytrace=False,
        )
    expected = entry.expected(samples)
    if matches(expected, observed):
        if kind(expected) == "xfail":
            pytest.xfail(expected)
        return
    pytest.fail(_explain(expected, observed, record["details"]), pytrace=False)

"""pytest options and hooks of the OpInfo suite (loaded by ``tests/conftest.py``).

The hooks run in the controlling process, also under pytest-xdist: each case's result reaches
it in the test report (``user_properties``), so ``--opinfo-update`` and ``--opinfo-results``
see every case of the run whatever worker ran it, and a worker that died (segfault) is recorded
as a crash of the case it was running.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any

import pytest

from .table import FLAVOURS, TABLE, Entry, Key, kind, merge_flavour, table_status

MODES = ("fast", "full", "off")
_PROPERTY = "opinfo"
_TEST = "test_opinfo.py::test_opinfo["

# Results of this run, by case key (filled from the reports in the controlling process).
_results: dict[Key, dict[str, Any]] = {}
_config: list[pytest.Config] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ort-lazy opinfo")
    group.addoption(
        "--opinfo",
        choices=MODES,
        default=os.environ.get("ORT_LAZY_OPINFO") or None,
        help="OpInfo parity cases: fast (the default: one float32 case, forward or backward, of half of "
        "the ops, one sample), full (every op, dtype and direction, two samples; the default with "
        "--full-tier) or off",
    )
    group.addoption("--opinfo-update", action="store_true", help="rewrite the expectations of the cases that ran")
    group.addoption("--opinfo-samples", type=int, default=None, help="samples per case (default: fast 1, full 2)")
    group.addoption("--opinfo-table", default=str(TABLE), help="the expectations table (default: %(default)s)")
    group.addoption("--opinfo-results", default=None, help="write one JSON line per case (status, errors, timings) here")
    group.addoption("--opinfo-timeout", type=float, default=300.0, help="seconds one case may take (default: %(default)s)")
    group.addoption(
        "--opinfo-flavour",
        choices=("auto", *FLAVOURS),
        default=os.environ.get("ORT_LAZY_OPINFO_FLAVOUR", "auto"),
        help="the onnxruntime flavour/provider the run is checked as (default auto: openvino when "
        "ORT_LAZY_PROVIDERS puts OpenVINO's provider in, training on onnxruntime-training, else "
        "standard); a flavour named must be the one detected. Its cases are checked against "
        "expectations-<flavour>.tsv over the main table, and its fast subset may be smaller",
    )


def pytest_configure(config: pytest.Config) -> None:
    _config[:] = [config]
    path = config.getoption("--opinfo-results")
    if path and not _is_worker(config):
        Path(path).write_text("", encoding="utf-8")


def _keep(key: Key, record: dict[str, Any]) -> None:
    """Remember a case's result; with ``--opinfo-results`` also append it to the file at once
    (a run cut short still leaves what it did)."""
    _results[key] = record
    config = _config[0] if _config else None
    path = config.getoption("--opinfo-results") if config is not None and not _is_worker(config) else None
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


_flavours: dict[str, str] = {}


def flavour(config: pytest.Config) -> str:
    """The flavour this run is checked as (``--opinfo-flavour``, see ``table.FLAVOURS``)."""
    if "run" not in _flavours:
        from .harness import run_flavour

        asked, found = config.getoption("--opinfo-flavour"), run_flavour()
        if asked not in ("auto", found):
            raise pytest.UsageError(
                f"--opinfo-flavour {asked}: this run is in the {found} flavour (ORT_LAZY_PROVIDERS=openvino,cpu "
                "on onnxruntime-openvino gives openvino; onnxruntime-training gives training)"
            )
        _flavours["run"] = found
    return _flavours["run"]


def mode(config: pytest.Config) -> str:
    """The OpInfo mode of this run: ``--opinfo`` (``ORT_LAZY_OPINFO``), else ``full`` in the
    full tier (``--full-tier``) and ``fast`` otherwise."""
    chosen = config.getoption("--opinfo")
    if chosen:
        return chosen
    return "full" if config.getoption("--full-tier", default=False) else "fast"


def samples(config: pytest.Config) -> int:
    """Samples per case for this run."""
    explicit = config.getoption("--opinfo-samples")
    if explicit:
        return int(explicit)
    return 2 if mode(config) == "full" else 1


def _case_key(nodeid: str) -> Key | None:
    if _TEST not in nodeid or not nodeid.endswith("]"):
        return None
    op, dtype, direction = nodeid.split(_TEST, 1)[1][:-1].rsplit("-", 2)
    return (op, dtype, direction)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == _PROPERTY:
            record = value if isinstance(value, dict) else json.loads(value)
            _keep((record["op"], record["dtype"], record["direction"]), record)
            return
    key = _case_key(report.nodeid)
    if key is None or key in _results or not report.failed:
        return
    if "crashed while running" in str(report.longrepr):
        # pytest-xdist: the worker died running this case (a segfault or abort in native code)
        status = "crash (worker process died)"
        _keep(key, {"op": key[0], "dtype": key[1], "direction": key[2], "status": status, "first": status, "samples": 1})


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _entry(record: dict[str, Any]) -> Entry:
    status, first = table_status(record["status"]), table_status(record["first"])
    return Entry(status, first if record.get("samples", 1) > 1 and first != status else None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _is_worker(config) or not _results:
        return
    results_path = config.getoption("--opinfo-results")
    if results_path:
        with open(results_path, "w", encoding="utf-8") as f:
            for key in sorted(_results):
                f.write(json.dumps(_results[key], sort_keys=True) + "\n")
    if config.getoption("--opinfo-update"):
        updates = {key: _entry(r) for key, r in _results.items()}
        merge_flavour(updates, flavour(config), Path(config.getoption("--opinfo-table")), one_sample=samples(config) == 1)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _is_worker(config) or not _results:
        return
    counts = collections.Counter(kind(r["status"]) for r in _results.values())
    seconds = sum(r.get("seconds", 0.0) for r in _results.values())
    parts = ", ".join(f"{k} {counts[k]}" for k in ("ort", "fallback", "wrong", "crash", "skip") if counts[k])
    terminalreporter.write_sep("-", "OpInfo parity")
    ops = sum(r.get("ops", 0) for r in _results.values())
    on_ort = sum(r.get("ops_on_ort", 0) for r in _results.values())
    share = f"; {on_ort}/{ops} compiled aten ops on ORT ({100.0 * on_ort / ops:.1f}%)" if ops else ""
    run = flavour(config)
    terminalreporter.write_line(f"{len(_results)} cases ({seconds:.0f} s in cases, {run} flavour): {parts}{share}")
    if config.getoption("--opinfo-update"):
        from .table import flavour_table

        terminalreporter.write_line(f"expectations updated: {flavour_table(run, Path(config.getoption('--opinfo-table')))}")

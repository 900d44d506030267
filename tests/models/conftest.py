"""The model zoo's summary: one table of the figures every zoo test measured, after the run.

The parity tests attach their run's figures as user properties (they travel from pytest-xdist
workers to the controller), and this prints them, xfailed runs included, so a run of the zoo
shows accuracy, ORT share and timings per model without extra tooling.
"""

from __future__ import annotations

import math
from typing import Any

import pytest


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key in ("zoo_inference", "zoo_training") and isinstance(value, dict):
                    rows.setdefault(value["model"], {})[key] = value
    if not rows:
        return
    tr = terminalreporter
    tr.section("ort-lazy model zoo")
    tr.write_line(
        f"{'model':<11} {'mode':<9} {'max rel err':>11} {'|g_ort|/|g|':>15} {'ORT share of ops':<44} "
        f"{'runs':>4} {'eager ms':>8} {'ort ms':>8} {'1st s':>6}  error"
    )
    for model in sorted(rows):
        for key, mode in (("zoo_inference", "inference"), ("zoo_training", "training")):
            row = rows[model].get(key)
            if row is None:
                continue
            err = row.get("max_rel_error", row.get("max_rel_grad_error"))
            ratio = row.get("grad_norm_ratio")
            ratio_text = f"{ratio[0]:.3f}-{ratio[1]:.3f}" if ratio else "-"
            shares = ", ".join(f"{tag} {s}" for tag, s in row["shares"].items()) or "-"
            tr.write_line(
                f"{model:<11} {mode:<9} {_fmt(err, '11.1e')} {ratio_text:>15} {shares:<44} "
                f"{row['ort_runs']:>4} {_fmt(row['eager_ms'], '8.2f')} {_fmt(row['ort_ms'], '8.2f')} "
                f"{_fmt(row['first_call_s'], '6.2f')}  {row['error']}"
            )

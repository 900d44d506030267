"""The OpInfo suite's own machinery: table format and merging, status matching, comparison
rules and the coverage page (no op is compiled here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import coverage, harness
from .table import TABLE, Entry, kind, matches, merge_into, read_table, table_status, write_table


def test_table_round_trip_sorted(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    entries = {
        ("sin", "bool", "forward"): Entry("fallback: no ONNX mapping (sin)"),
        ("add", "float32", "backward"): Entry("ort"),
        ("add", "float32", "forward"): Entry("xfail: wrong (output 0) [ort]", "ort"),
        ("add", "float64", "forward"): Entry("ort"),
    }
    write_table(entries, path)
    assert read_table(path) == entries
    rows = [line.split("\t")[:3] for line in path.read_text().splitlines() if not line.startswith("#")]
    # op, then dtype in DTYPES order (float64 first), then direction in DIRECTIONS order
    assert rows == [
        ["add", "float64", "forward"],
        ["add", "float32", "forward"],
        ["add", "float32", "backward"],
        ["sin", "bool", "forward"],
    ]


def test_merge_updates_only_what_ran_and_keeps_justifications(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    write_table(
        {
            ("a", "float32", "forward"): Entry("ort"),
            ("b", "float32", "forward"): Entry("xfail: wrong (output 0) -- ORT Erf is approximate"),
            ("c", "float32", "forward"): Entry("xfail: crash (RuntimeError: x)"),
        },
        path,
    )
    merged = merge_into(
        {
            ("b", "float32", "forward"): Entry("xfail: wrong (output 1)"),
            ("c", "float32", "forward"): Entry("xfail: crash (RuntimeError: y)"),
            ("d", "int64", "forward"): Entry("fallback: no ONNX mapping (d)"),
        },
        path,
    )
    assert merged == read_table(path)
    assert merged[("a", "float32", "forward")].status == "ort"
    assert merged[("b", "float32", "forward")].status.endswith("-- ORT Erf is approximate")
    assert merged[("c", "float32", "forward")].status == "xfail: crash (RuntimeError: y)"
    assert merged[("d", "int64", "forward")].status == "fallback: no ONNX mapping (d)"


def test_status_kinds_and_matching() -> None:
    assert [kind(s) for s in ("ort", "fallback: x (y)", "wrong (grad 0)", "crash (E: m)", "skip: z", "xfail: wrong (g)")] == [
        "ort", "fallback", "wrong", "crash", "skip", "xfail",
    ]  # fmt: skip
    assert table_status("crash (E: m)") == "xfail: crash (E: m)"
    assert table_status("ort") == "ort"
    assert matches("xfail: wrong (output 0)", "crash (E: m)")
    assert not matches("xfail: wrong (output 0)", "ort")
    assert not matches("ort", "fallback: no ONNX mapping (x)")
    assert not matches("fallback: no ONNX mapping (x)", "fallback: no ORT kernel: X(bfloat16) (x)")
    # the fast subset (one sample) is checked against the first sample's status when recorded
    entry = Entry("xfail: crash (E: m)", "ort")
    assert entry.expected(1) == "ort" and entry.expected(2) == "xfail: crash (E: m)"


def test_case_ids_round_trip() -> None:
    case = harness.Case("nn.functional.interpolate/nearest-exact", "float32", "no_grad")
    assert harness.Case.from_id(case.id) == case


def test_tolerances_and_exact_integers() -> None:
    e = torch.tensor([1.0, 2.0, 3.0])
    assert harness._compare_tensor(e + 1e-6, e, "output 0", True)[0] is None
    assert harness._compare_tensor(e + 1e-3, e, "output 0", True)[0] is not None
    half = e.half()
    assert harness._compare_tensor(half + 0.001, half, "output 0", True)[0] is None  # last bit
    i = torch.tensor([1, 2, 3])
    assert harness._compare_tensor(i + 1, i, "output 0", True)[0] is not None
    assert harness._compare_tensor(i + 1, i, "output 0", exact_index=False)[0] is None
    nan = torch.tensor([float("nan"), 1.0])
    assert harness._compare_tensor(nan.clone(), nan, "output 0", True)[0] is None
    assert harness._compare_tensor(torch.tensor([0.0, 1.0]), nan, "output 0", True)[0] is not None


def test_fold_prefers_defects_then_ort() -> None:
    s = harness.SampleResult
    assert harness._fold([s(0, "ort"), s(1, "crash (E: m)")]) == "crash (E: m)"
    assert harness._fold([s(0, "skip: eager raises"), s(1, "ort")]) == "ort"
    merged = harness._fold(
        [
            s(0, "fallback: x", reasons={"no ONNX mapping": {"b"}}),
            s(1, "fallback: y", reasons={"no ONNX mapping": {"a"}, "region too small": set()}),
        ]
    )
    assert merged == "fallback: no ONNX mapping (a, b); region too small"


@pytest.mark.skipif(not TABLE.exists(), reason="no expectations table yet")
def test_coverage_page_is_current() -> None:
    """docs/COVERAGE.md is regenerated whenever the table changes."""
    assert coverage.main(["--check"]) == 0, "run: python tests/opinfo/coverage.py"

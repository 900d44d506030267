"""The OpInfo suite's own machinery: table format and merging, status matching, comparison
rules and the coverage page (no op is compiled here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import coverage, harness
from .selection import FAST_BACKWARD, FAST_FORWARD, fast_groups, group
from .table import (
    TABLE,
    Entry,
    flavour_table,
    kind,
    matches,
    merge_flavour,
    merge_into,
    read_expectations,
    read_table,
    table_status,
    write_table,
)


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


def test_a_flavour_table_holds_only_what_differs_and_overlays_the_main_one(tmp_path: Path) -> None:
    main = tmp_path / "expectations.tsv"
    write_table(
        {
            ("a", "float32", "forward"): Entry("ort"),
            ("b", "float32", "forward"): Entry("fallback: no ORT kernel: X(float) (b)"),
            ("c", "float32", "forward"): Entry("xfail: crash (E: m)", "ort"),
        },
        main,
    )
    assert flavour_table("openvino", main) == tmp_path / "expectations-openvino.tsv"
    assert flavour_table("standard", main) == main
    with pytest.raises(ValueError, match="unknown flavour"):
        flavour_table("rocm", main)
    written = merge_flavour(
        {
            ("a", "float32", "forward"): Entry("ort"),  # as in the main table: not written
            ("b", "float32", "forward"): Entry("fallback: ORT session failed (b)"),
            ("c", "float32", "forward"): Entry("ort"),  # one sample: the main table's first-sample status
        },
        "openvino",
        main,
        one_sample=True,
    )
    assert written == {("b", "float32", "forward"): Entry("fallback: ORT session failed (b)")}
    assert read_table(flavour_table("openvino", main)) == written
    overlaid = read_expectations("openvino", main)
    assert overlaid[("b", "float32", "forward")].status == "fallback: ORT session failed (b)"
    assert overlaid[("a", "float32", "forward")].status == "ort" and read_expectations("standard", main) == read_table(main)
    # a case back to the main table's status leaves the flavour's table; the main table is untouched
    assert merge_flavour({("b", "float32", "forward"): Entry("fallback: no ORT kernel: X(float) (b)")}, "openvino", main) == {}
    assert read_table(main)[("b", "float32", "forward")].status == "fallback: no ORT kernel: X(float) (b)"


def test_flavours_fast_subsets() -> None:
    assert fast_groups() == (FAST_FORWARD, FAST_BACKWARD) == fast_groups("training")
    openvino = harness.all_cases("fast", "openvino")
    assert {(c.dtype, c.direction) for c in openvino} == {("float32", "forward")}
    assert len(openvino) < len(harness.all_cases("fast"))


def test_coverage_page_compares_the_flavours(tmp_path: Path) -> None:
    a, b = [name for name in (f"op{i}" for i in range(100)) if group(name) in FAST_FORWARD][:2]  # in the fast subset
    main = {(a, "float32", "forward"): Entry("ort"), (b, "float32", "forward"): Entry(f"fallback: x ({b})")}
    openvino = {**main, (a, "float32", "forward"): Entry(f"fallback: ORT session failed ({a})")}
    page = coverage.render(main, {"standard": main, "openvino": openvino})
    assert "| openvino | onnxruntime-openvino 1.24.1 (ORT 1.24) |" in page
    assert "| standard | 2 | 1 (50.0%) | 1 (50.0%) |" in page and "| openvino | 2 | 0 (0.0%) | 2 (100.0%) |" in page


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

"""Render ``docs/COVERAGE.md`` from the OpInfo expectations table.

    python tests/opinfo/coverage.py            # write docs/COVERAGE.md
    python tests/opinfo/coverage.py --check    # exit 1 when the page is out of date

The page is a pure function of ``tests/opinfo/expectations.tsv``, the flavours' tables beside it
(``expectations-<flavour>.tsv``) and the suite's fixed selection, so ``test_table.py`` can check
that it was regenerated with the tables.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Mapping
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``opinfo`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opinfo.selection import FAST_GROUPS, RANDOM_OPS, fast_cases, fast_groups  # noqa: E402
from opinfo.table import DIRECTIONS, DTYPES, FLAVOURS, TABLE, Entry, Key, kind, read_expectations, read_table  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "docs" / "COVERAGE.md"
KINDS = ("ort", "fallback", "xfail", "skip")

#: The onnxruntime each flavour's table was made with: (flavour, onnxruntime, providers). Other
#: versions are not checked by the suite.
PROVEN = {
    "standard": ("onnxruntime 1.32", "CPU"),
    "openvino": ("onnxruntime-openvino 1.24.1 (ORT 1.24)", "OpenVINO, then CPU (`ORT_LAZY_PROVIDERS=openvino,cpu`)"),
    "training": ("onnxruntime-training 1.19.2 (ORT 1.19)", "CPU"),
}
#: a matching case whose graph holds no compute op (views, metadata): nothing to run anywhere
NO_COMPUTE = "fallback: no compute op in the graph"


def _kind(status: str) -> str:
    return "none" if status == NO_COMPUTE else kind(status)


def _pct(n: int, total: int) -> str:
    return f"{n} ({100.0 * n / total:.1f}%)" if total else str(n)


def _row(label: list[str], statuses: list[str]) -> str:
    counts = collections.Counter(_kind(s) for s in statuses)
    compared = len(statuses) - counts["skip"] - counts["none"]
    cells = [str(len(statuses))] + [_pct(counts[k], compared) for k in KINDS[:3]] + [str(counts["none"]), str(counts["skip"])]
    return "| " + " | ".join(label + cells) + " |"


def _reason_parts(status: str) -> list[str]:
    """The reasons of a ``fallback:`` status without their op lists."""
    body = status.removeprefix("fallback: ")
    return [part if part.startswith("no graph") else re.sub(r" \([^()]*(\([^()]*\)[^()]*)*\)$", "", part) for part in body.split("; ")]


def _cases_text(keys: list[Key]) -> str:
    """``float32 forward, backward; int64 forward`` for the cases of one op."""
    by_dtype: dict[str, list[str]] = collections.defaultdict(list)
    for _, dtype, direction in keys:
        by_dtype[dtype].append(direction)
    return "; ".join(f"{d} {', '.join(by_dtype[d])}" for d in DTYPES if d in by_dtype)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _flavour_rows(flavours: Mapping[str, Mapping[Key, Entry]]) -> list[str]:
    """The section comparing the flavours on the fast subset (first-sample statuses)."""
    out = [
        "",
        "## Providers and onnxruntime flavours",
        "",
        "The suite runs on the onnxruntime flavour installed, with the providers ort-lazy is given",
        "(`ORT_LAZY_PROVIDERS`); each flavour is checked against `tests/opinfo/expectations.tsv` overlaid",
        "with its own table, `expectations-<flavour>.tsv`, which holds the cases whose status differs there",
        "(another fallback reason, a kernel that version lacks). Proven versions, the ones the tables were",
        "made with (other versions are not checked; `src/ort_lazy/runtime/known_bugs.py` says per known",
        "onnxruntime bug which versions have it):",
        "",
        "| flavour | onnxruntime | providers | fast subset in CI | differing cases |",
        "|---|---|---|---|---:|",
    ]
    for name in FLAVOURS:
        if name not in flavours:
            continue
        version, providers = PROVEN[name]
        pairs = _fast_subset(name)
        differing = sum(1 for key, e in flavours[name].items() if flavours["standard"].get(key) != e)
        out.append(f"| {name} | {version} | {providers} | {pairs} | {differing} |")
    out += [
        "",
        "Each flavour on the same cases, every op in float32 forward (one sample; every flavour's table",
        "was made from a run of at least these):",
        "",
        "| flavour | cases | ort | fallback | xfail | no compute | skip |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in FLAVOURS:
        if name in flavours:
            statuses = [e.expected(1) for (_, d, r), e in flavours[name].items() if (d, r) == ("float32", "forward")]
            out.append(_row([name], statuses))
    return out


def _fast_subset(flavour: str) -> str:
    """``flavour``'s fast subset in words (see ``selection.fast_groups``)."""
    forward, backward = fast_groups(flavour)
    parts = [f"float32 forward of {len(forward)}/{FAST_GROUPS} of the ops"] if forward else []
    if backward:
        parts.append(f"float32 backward of {len(backward)}/{FAST_GROUPS}")
    return ", ".join(parts)


def render(entries: Mapping[Key, Entry], flavours: Mapping[str, Mapping[Key, Entry]] | None = None) -> str:
    """The Markdown page for ``entries`` (the main table) and ``flavours`` (flavour -> its
    expectations, :func:`~opinfo.table.read_expectations`)."""
    out = [
        "# OpInfo coverage",
        "",
        "What of PyTorch's operator database (`torch.testing._internal.common_methods_invocations.op_db`)",
        'runs on ONNX Runtime through `torch.compile(fn, backend="ort")`, checked against eager PyTorch by',
        "the OpInfo parity suite (`tests/opinfo`). Generated from `tests/opinfo/expectations.tsv` by",
        "`python tests/opinfo/coverage.py`; do not edit by hand.",
        "",
        "A case is one OpInfo (and variant), one dtype and one direction: `forward` (inputs not requiring",
        "grad), `backward` (gradients by `torch.autograd.grad`, forward outputs compared too) and `no_grad`",
        "(forward under `torch.no_grad()`, lowered without AOTAutograd), on the first two samples eager",
        "can run. Status:",
        "",
        "- **ort**: matches eager and ORT ran (for `backward`: the backward graph ran on ORT). A float32 /",
        "  float16 / bfloat16 output or gradient beyond the tolerance still matches when it is no more",
        "  than twice as far from a float64 run of eager as eager is (an ill-conditioned computation,",
        "  e.g. `logcumsumexp`'s gradient, where eager itself is 2e-3 off in float32);",
        "- **fallback**: matches eager, nothing ran on ORT (reason below);",
        "- **xfail**: a known defect, the compiled call differs from eager (`wrong`) or raises (`crash`);",
        "- **no compute**: matches eager, and the graph holds no compute op (views, metadata): there",
        "  is nothing to run on any engine;",
        "- **skip**: nothing to compare (eager raises on every sample, no differentiable output ...).",
        "",
        "Shares are of the cases with something to run (no-compute cases and skips left out).",
        "",
        "## By dtype and direction",
        "",
        "| dtype | direction | cases | ort | fallback | xfail | no compute | skip |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype in DTYPES:
        for direction in DIRECTIONS:
            statuses = [e.status for (_, d, r), e in entries.items() if d == dtype and r == direction]
            if statuses:
                out.append(_row([dtype, direction], statuses))
    for direction in DIRECTIONS:
        statuses = [e.status for (_, _, r), e in entries.items() if r == direction]
        out.append(_row(["**all**", f"**{direction}**"], statuses))
    out.append(_row(["**all**", "**all**"], [e.status for e in entries.values()]))

    fast_keys = fast_cases(entries)
    fast = [e.expected(1) for key, e in entries.items() if key in fast_keys]
    ops = {op for op, _, _ in entries}
    ort_ops = {op for (op, _, _), e in entries.items() if e.status == "ort"}
    out += [
        "",
        f"OpInfos: {len(ops)} (+{len(RANDOM_OPS)} random ones not run, below); "
        f"{len(ort_ops)} run on ORT in at least one case. Fast subset (`pytest tests/opinfo`, one sample): "
        f"{len(fast)} cases, " + ", ".join(f"{k} {sum(1 for s in fast if kind(s) == k)}" for k in KINDS) + ".",
    ]
    if flavours:
        out += _flavour_rows(flavours)
    out += [
        "",
        "## Fallback reasons",
        "",
        "Cases per reason (a case may have several).",
        "",
        "| reason | cases |",
        "|---|---:|",
    ]
    reasons = collections.Counter(p for e in entries.values() if kind(e.status) == "fallback" for p in _reason_parts(e.status))
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        out.append(f"| {_escape(reason)} | {n} |")

    out += ["", "## Known defects (xfail)", ""]
    defects: dict[str, dict[str, list[Key]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for key, e in sorted(entries.items()):
        if kind(e.status) == "xfail":
            defects[key[0]][e.status.removeprefix("xfail: ")].append(key)
    if defects:
        out += ["| op | cases | status |", "|---|---|---|"]
        for op in sorted(defects):
            for status, keys in sorted(defects[op].items()):
                out.append(f"| `{op}` | {_cases_text(keys)} | {_escape(status)} |")
    else:
        out.append("None.")

    out += [
        "",
        "## OpInfos that never reach ORT",
        "",
        "No case of these runs on ORT; their statuses, with the number of cases.",
        "",
        "| op | statuses |",
        "|---|---|",
    ]
    for op in sorted(ops - ort_ops):
        counts = collections.Counter(e.status for (o, _, _), e in entries.items() if o == op)
        text = "<br>".join(f"{_escape(s)} ({n})" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(f"| `{op}` | {text} |")

    out += [
        "",
        "## Not run",
        "",
        "Random or uninitialised-memory OpInfos (eager differs from itself): "
        + ", ".join(f"`{op}`" for op in sorted(RANDOM_OPS))
        + ".",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=TABLE, help="expectations table (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=PAGE, help="page to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check that the page is up to date")
    args = parser.parse_args(argv)
    flavours = {
        f: read_expectations(f, args.table)
        for f in FLAVOURS
        if f == "standard" or args.table.with_name(f"{args.table.stem}-{f}{args.table.suffix}").exists()
    }
    page = render(read_table(args.table), flavours)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != page:
            print(f"{args.out} is out of date: run python tests/opinfo/coverage.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The expectations table: one line per OpInfo case with the status it must keep.

Format (tab-separated, ``#`` starts a comment line, sorted by op, dtype, direction)::

    op[/variant]  dtype  direction  status  [first-sample status]

``status`` is one of

- ``ort``: matches eager and ORT really ran (for ``backward``: in the backward pass);
- ``fallback: <reason>``: matches eager, nothing ran on ORT, for the reason given;
- ``xfail: wrong (...)`` / ``xfail: crash (...)``: a known defect (differs from eager, or the
  compiled call raises where eager does not). ``--opinfo-update`` writes them; a justification
  added by hand after `` -- `` is kept by later updates while the case still fails;
- ``skip: <why>``: nothing to compare (eager raises on every sample, nondeterministic ...).

The optional fifth column is the status of the first sample alone, written only when it
differs from the status over all samples: the fast subset runs one sample and is checked
against it.

Flavours (:data:`FLAVOURS`): ``expectations.tsv`` holds the standard run (onnxruntime's CPU
provider). A run on another onnxruntime flavour or provider (``openvino``: OpenVINO's provider
first, ``ORT_LAZY_PROVIDERS=openvino,cpu``; ``training``: onnxruntime-training) is checked against
the main table overlaid with its own, ``expectations-<flavour>.tsv``, which holds only the cases
whose status differs there (another fallback reason, a kernel that version lacks ...):
:func:`read_expectations`, :func:`merge_flavour`.

No torch import here: ``coverage.py`` reads the table without loading PyTorch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DIRECTIONS",
    "DTYPES",
    "FLAVOURS",
    "TABLE",
    "flavour_table",
    "read_expectations",
    "merge_flavour",
    "Entry",
    "Key",
    "kind",
    "table_status",
    "matches",
    "read_table",
    "write_table",
    "merge_into",
]

TABLE = Path(__file__).with_name("expectations.tsv")

#: the flavours a run may be checked as (``standard``: the main table alone)
FLAVOURS = ("standard", "openvino", "training")

DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "bool")
DIRECTIONS = ("forward", "backward", "no_grad")

#: (op[/variant], dtype, direction)
Key = tuple[str, str, str]

_HEADER = """\
# OpInfo parity expectations: torch.compile(fn, backend="ort") against eager PyTorch.
# One line per case: op[/variant] <TAB> dtype <TAB> direction <TAB> status [<TAB> first-sample status]
# status: ort | fallback: <reason> | xfail: wrong (...) | xfail: crash (...) | skip: <why>
# Regenerate (merges; only the cases that ran change):
#   pytest tests/opinfo --opinfo=full --opinfo-update -n 1
# Justify an xfail by appending " -- <why>" to its status; updates keep it while it still fails.
"""


@dataclass(frozen=True)
class Entry:
    """The expected status of one case (see the module docstring)."""

    status: str
    first: str | None = None

    def expected(self, samples: int) -> str:
        """The status a run over ``samples`` samples must match."""
        return self.first if samples == 1 and self.first else self.status


def kind(status: str) -> str:
    """``ort``, ``fallback``, ``wrong``, ``crash``, ``skip`` or ``xfail`` of a status string."""
    head = status.split(":", 1)[0].split(" (", 1)[0].strip()
    return head


def table_status(observed: str) -> str:
    """How an observed status is written to the table: defects become ``xfail: ...``."""
    return f"xfail: {observed}" if kind(observed) in ("wrong", "crash") else observed


def matches(expected: str, observed: str) -> bool:
    """Whether ``observed`` keeps the table's ``expected`` status.

    An ``xfail`` entry is matched by any defect (wrong or crash): it is known broken either way.
    """
    if kind(expected) == "xfail":
        return kind(observed) in ("wrong", "crash")
    return expected == observed


def _sort_key(key: Key) -> tuple[str, int, int]:
    op, dtype, direction = key
    return (
        op,
        DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES),
        DIRECTIONS.index(direction) if direction in DIRECTIONS else len(DIRECTIONS),
    )


def read_table(path: Path = TABLE) -> dict[Key, Entry]:
    """The table at ``path`` (empty when the file does not exist)."""
    entries: dict[Key, Entry] = {}
    if not path.exists():
        return entries
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) not in (4, 5):
            raise ValueError(f"{path}:{number}: expected 4 or 5 tab-separated fields, got {len(fields)}")
        op, dtype, direction, status = fields[:4]
        entries[(op, dtype, direction)] = Entry(status, fields[4] if len(fields) == 5 else None)
    return entries


def write_table(entries: Mapping[Key, Entry], path: Path = TABLE, header: str = _HEADER) -> None:
    """Write ``entries`` sorted, atomically (a reader never sees half a table), under ``header``."""
    lines = [header.rstrip("\n")]
    for key in sorted(entries, key=_sort_key):
        entry = entries[key]
        fields = [*key, entry.status] + ([entry.first] if entry.first else [])
        lines.append("\t".join(fields))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".expectations-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write of the table between processes (concurrent shards)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"ort-lazy-opinfo-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _merged(old: Entry | None, new: Entry) -> Entry:
    """``new``, but a hand-written justification (`` -- why``) of a still-failing xfail stays."""
    if old is not None and kind(old.status) == "xfail" and " -- " in old.status and kind(new.status) == "xfail":
        return Entry(old.status, new.first)
    return new


def merge_into(updates: Mapping[Key, Entry], path: Path = TABLE) -> dict[Key, Entry]:
    """Update the cases in ``updates``, keep every other line; returns the written table."""
    with _locked(path):
        entries = read_table(path)
        for key, entry in updates.items():
            entries[key] = _merged(entries.get(key), entry)
        write_table(entries, path)
    return entries


def _flavour_header(flavour: str, main: Path) -> str:
    return (
        f"# OpInfo parity expectations in the {flavour} flavour: only the cases whose status differs from\n"
        f"# {main.name} (the run is checked against {main.name} overlaid with this table).\n"
        "# One line per case: op[/variant] <TAB> dtype <TAB> direction <TAB> status [<TAB> first-sample status]\n"
        f"# Regenerate in that flavour (see tests/opinfo/test_opinfo.py): pytest tests/opinfo --opinfo-update\n"
    )


def flavour_table(flavour: str, main: Path = TABLE) -> Path:
    """The table of ``flavour``'s differences, beside ``main`` (``main`` itself for ``standard``)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}: one of {', '.join(FLAVOURS)}")
    return main if flavour == "standard" else main.with_name(f"{main.stem}-{flavour}{main.suffix}")


def read_expectations(flavour: str = "standard", main: Path = TABLE) -> dict[Key, Entry]:
    """What a run in ``flavour`` must give: the main table, overlaid with ``flavour``'s."""
    entries = read_table(main)
    if flavour != "standard":
        entries.update(read_table(flavour_table(flavour, main)))
    return entries


def merge_flavour(
    updates: Mapping[Key, Entry], flavour: str, main: Path = TABLE, one_sample: bool = False
) -> dict[Key, Entry]:
    """Record ``updates`` (the cases a run in ``flavour`` ran): in the main table for
    ``standard``; else in ``flavour``'s table, which keeps only the cases whose status differs
    from the main table's (a case now equal to it leaves). ``one_sample``: the run took one
    sample per case, so a case differs when its status differs from the main table's first-sample
    status. Returns the written table."""
    if flavour == "standard":
        return merge_into(updates, main)
    path = flavour_table(flavour, main)
    base = read_table(main)
    with _locked(path):
        entries = read_table(path)
        for key, entry in updates.items():
            merged = _merged(entries.get(key), entry)
            same = base.get(key) == merged
            if one_sample and key in base:  # a one-sample run knows the first sample's status only
                same = base[key].expected(1) == merged.status
            if same:
                entries.pop(key, None)
            else:
                entries[key] = merged
        write_table(entries, path, _flavour_header(flavour, main))
    return entries

"""The persistent compile cache: reuse across processes, verification, privacy, concurrency."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import assert_close, compile_ort
from ort_lazy import metrics
from ort_lazy.runtime.disk_cache import DiskCache, disk_cache

CHILD = textwrap.dedent(
    """
    import json, sys, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU(), torch.nn.Linear(8, 2)).eval()
    f = torch.compile(model, backend="ort", options={"cache_dir": sys.argv[1]})
    x = torch.randn(2, 4, 8)  # 3-d: the linear layers are MatMuls, whose operands' ranks matter
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x))
    from ort_lazy import metrics
    print(json.dumps({
        "counters": metrics.counters(),
        "exporter_loaded": "torch.onnx._internal.exporter._core" in sys.modules,
        "onnx_loaded": "onnx" in sys.modules,
    }))
    """
)


def _run_child(cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(cache)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_reuses_models_without_the_exporter(tmp_path):
    cache = tmp_path / "cache"
    cold = _run_child(cache)
    assert cold["counters"]["disk_cache_misses"] == 1 and cold["exporter_loaded"]
    warm = _run_child(cache)
    assert warm["counters"]["disk_cache_hits"] == 1
    assert warm["counters"]["ort_runs"] == 1
    # the exporter (seconds to import and build) is never loaded by a warm process, nor onnx
    # (half a second to import): what opening a session reads from a model (its work, its
    # MatMuls' operand ranks, its Sigmoids made exact) is done once, kept with it
    assert not warm["exporter_loaded"]
    assert not warm["onnx_loaded"]


def _entry(cache: Path) -> tuple[Path, Path]:
    (meta,) = [p for p in cache.glob("*.json") if not p.name.endswith(".doc.json")]
    return meta, meta.with_suffix(".onnx")


def _compile_once(cache: Path) -> None:
    x = torch.randn(3, 5)
    f = compile_ort(lambda t: torch.tanh(t) * 2, cache_dir=str(cache))
    assert_close(f(x), torch.tanh(x) * 2)


@pytest.mark.parametrize("damage", ["tamper", "truncate", "foreign-version", "garbage-meta"])
def test_damaged_entries_are_rejected_and_rebuilt(tmp_path, damage):
    cache = tmp_path / "c"
    _compile_once(cache)
    meta, blob = _entry(cache)
    if damage == "tamper":
        data = bytearray(blob.read_bytes())
        data[-5] ^= 0xFF
        blob.write_bytes(bytes(data))
    elif damage == "truncate":
        blob.write_bytes(blob.read_bytes()[:20])
    elif damage == "foreign-version":
        doc = json.loads(meta.read_text())
        doc["versions"]["torch"] = "1.0.0"
        meta.write_text(json.dumps(doc))
    else:
        meta.write_text("{not json")
    metrics.reset()
    _compile_once(cache)
    c = metrics.counters()
    assert c["disk_cache_rejected"] == 1 and c["disk_cache_hits"] == 0
    assert c["ort_runs"] == 1  # rebuilt, and ORT ran the rebuilt model
    # the rebuilt entry is valid again
    metrics.reset()
    _compile_once(cache)
    assert metrics.counters()["disk_cache_hits"] == 1


def test_cache_files_are_private(tmp_path):
    cache = tmp_path / "priv"
    _compile_once(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    for p in cache.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_world_writable_directory_is_refused(tmp_path, caplog):
    bad = tmp_path / "shared"
    bad.mkdir()
    os.chmod(bad, 0o777)
    assert disk_cache(str(bad)) is None  # refused: logged, compilation carries on uncached
    x = torch.randn(3)
    f = compile_ort(lambda t: t + 1, cache_dir=str(bad))
    assert_close(f(x), x + 1)
    assert not list(bad.glob("*.onnx"))


def test_nothing_is_unpickled(tmp_path):
    """Entries are ONNX bytes and JSON; a pickle planted as an entry is rejected, never loaded."""
    import pickle

    cache = DiskCache(tmp_path / "p")
    key = "a" * 64
    (cache.root / f"{key}.onnx").write_bytes(pickle.dumps({"x": 1}))
    (cache.root / f"{key}.json").write_bytes(pickle.dumps({"x": 1}))
    assert cache.get_model(key) is None
    assert not (cache.root / f"{key}.json").exists()


@pytest.mark.full
def test_two_processes_compiling_at_once_leave_one_valid_entry(tmp_path):
    cache = tmp_path / "race"
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    models = [p for p in cache.glob("*.json") if not p.name.endswith(".doc.json")]
    assert len(models) == 1
    assert not list(cache.glob(".*.tmp"))
    assert DiskCache(cache).get_model(models[0].stem) is not None

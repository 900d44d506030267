"""The nvtx option: ranges around export, session creation and every run, balanced."""

from __future__ import annotations

import logging

import torch

from helpers import assert_close, assert_ran_on_ort, compile_ort
from ort_lazy.debug import nvtx


def test_ranges_wrap_export_session_and_runs(monkeypatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(nvtx, "_checked", True)
    monkeypatch.setattr(nvtx, "_functions", (lambda name: events.append("push " + name), lambda: events.append("pop")))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    compiled = compile_ort(model, nvtx=True)
    with torch.no_grad():
        for _ in range(3):
            assert_close(compiled(x), model(x))
    assert_ran_on_ort(3)
    pushes = [e[5:] for e in events if e.startswith("push ")]
    kinds = [p.split(":")[0] for p in pushes]
    assert kinds.count("ort_lazy.export") == 1 and kinds.count("ort_lazy.session") == 1
    assert kinds.count("ort_lazy.run") == 3
    assert events.count("pop") == len(pushes)
    depth = 0
    for e in events:  # properly nested
        depth += 1 if e.startswith("push") else -1
        assert depth >= 0
    assert depth == 0


def test_no_ranges_unless_asked(monkeypatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(nvtx, "_checked", True)
    monkeypatch.setattr(nvtx, "_functions", (events.append, lambda: events.append("pop")))
    compile_ort(lambda x: x.sin() + 1)(torch.randn(3))
    assert events == []


def test_without_nvtx_in_torch_it_warns_once_and_runs(monkeypatch, caplog) -> None:
    monkeypatch.setattr(nvtx, "_checked", False)
    monkeypatch.setattr(nvtx, "_functions", None)

    def missing(name: str) -> None:
        raise RuntimeError("NVTX functions not installed")

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", missing)
    from ort_lazy import metrics

    monkeypatch.setattr(metrics, "_warned", set())
    x = torch.randn(5)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        assert_close(compile_ort(lambda t: t.cos() * 2, nvtx=True)(x), x.cos() * 2)
        assert not nvtx.available()
    assert_ran_on_ort()
    assert sum("nvtx option needs" in r.getMessage() for r in caplog.records) == 1

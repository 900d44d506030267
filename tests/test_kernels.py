"""ORT's kernel registry: read safely whatever providers the installed build has."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from helpers import assert_close, compile_ort
from ort_lazy import metrics
from ort_lazy.runtime import _ort, kernels


@pytest.fixture
def fresh_registry():
    kernels.kernel_registry.cache_clear()
    yield
    kernels.kernel_registry.cache_clear()


def _rows(defs):
    return sorted((d.op_name, d.domain, d.provider, d.version_range, sorted((k, sorted(v)) for k, v in d.type_constraints.items())) for d in defs)


def test_builds_with_provider_libraries_are_read_in_a_child_process(monkeypatch):
    """onnxruntime-gpu's get_all_opkernel_def kills the process when a provider library it was
    built with cannot load (TensorRT's libnvinfer missing: the usual GPU install). Builds with
    provider libraries are read in a child, with the same result as reading in-process."""
    in_process = _ort.kernel_defs() if not _ort.provider_libraries() else None
    monkeypatch.setattr(_ort, "provider_libraries", lambda: ["libonnxruntime_providers_tensorrt.so"])
    apart = _ort.kernel_defs()
    assert len(apart) > 1000
    assert {"CPUExecutionProvider"} <= {d.provider for d in apart}
    if in_process is not None:
        assert _rows(apart) == _rows(in_process)


def test_cpu_package_has_no_provider_libraries():
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a GPU build")
    assert _ort.provider_libraries() == []


@pytest.mark.parametrize(
    "code, expected",
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "died of SIGSEGV"),
        ("import sys; sys.stderr.write('Failed to load library libonnxruntime_providers_tensorrt.so\\n'); sys.exit(3)",
         "failed (exit 3): Failed to load library libonnxruntime_providers_tensorrt.so"),
        ("print('not json')", "unreadable output"),
    ],
    ids=["crash", "error", "garbage"],
)
def test_a_failed_read_is_a_clear_error(code, expected):
    with pytest.raises(_ort.KernelDefsUnavailableError, match=re.escape(expected)):
        _ort._kernel_defs_apart(code)


def test_without_a_kernel_list_sessions_decide(monkeypatch, fresh_registry, caplog):
    """No kernel list (the child reading it crashed): one warning, every op unknown to the
    support table; ORT's session creation then decides, a region it refuses runs in PyTorch,
    and results stay eager's."""

    def unreadable():
        raise _ort.KernelDefsUnavailableError("the process reading them died of SIGSEGV")

    monkeypatch.setattr(kernels, "kernel_defs", unreadable)
    metrics.reset()
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        registry = kernels.kernel_registry()
    assert not registry.knows("", "Add")
    assert any("kernel list could not be read" in r.getMessage() for r in caplog.records)

    def f(x):
        return torch.tanh(x) * 2 + x.mean()

    x = torch.randn(4, 5)
    assert_close(compile_ort(f)(x), f(x))
    assert metrics.counters()["ort_runs"] >= 1

    def g(a, b):
        return a + b  # bool Add: translated to Add(bool), which ORT has no kernel for

    a, b = torch.tensor([True, False]), torch.tensor([True, True])
    assert torch.equal(compile_ort(g)(a, b), g(a, b))
    c = metrics.counters()
    assert c["ort_failures"] + c["fallback_ops"] >= 1, c

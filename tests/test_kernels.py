"""ORT's kernel registry: read safely whatever providers the installed build has."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from helpers import assert_close, compile_ort
from ort_lazy import metrics
from ort_lazy.reasons import Reason
from ort_lazy.runtime import _ort, flavour, kernels


@pytest.fixture
def fresh_registry():
    """A registry read anew, and support answers learnt anew (they were learnt from it)."""
    from ort_lazy.support import probes

    kernels.kernel_registry.cache_clear()
    probes._probe_tables.clear()
    metrics._warned.discard("kernel_defs")  # its warning is given once per process
    yield
    kernels.kernel_registry.cache_clear()
    probes._probe_tables.clear()


def _rows(defs):
    return sorted((d.op_name, d.domain, d.provider, d.version_range, sorted((k, sorted(v)) for k, v in d.type_constraints.items())) for d in defs)


def test_builds_with_provider_libraries_are_read_in_a_child_process(monkeypatch):
    """onnxruntime-gpu's get_all_opkernel_def kills the process when a provider library it was
    built with cannot load (TensorRT's libnvinfer missing: the usual GPU install). Builds with
    provider libraries are read in a child (onnxruntime-gpu's, whose providers list their kernels
    there), with the same result as reading in-process."""
    if _ort.provider_libraries():
        pytest.skip("a build with provider libraries: whether the child can read them depends on which load")
    in_process = _ort.kernel_defs()
    monkeypatch.setattr(_ort, "provider_libraries", lambda: ["libonnxruntime_providers_tensorrt.so"])
    monkeypatch.setattr(flavour, "flavour", lambda: "onnxruntime-gpu")
    apart = _ort.kernel_defs()
    assert len(apart) > 1000
    assert {"CPUExecutionProvider"} <= {d.provider for d in apart}
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
    assert not registry.knows("", "Add") and not registry.complete
    assert any("kernel list could not be read" in r.getMessage() for r in caplog.records)

    def f(x):
        return torch.tanh(x) * 2 + x.mean()

    x = torch.randn(4, 5)
    assert_close(compile_ort(f)(x), f(x))
    assert metrics.counters()["ort_runs"] >= 1

    def g(a, b):
        return a * b  # bfloat16 Mul: ORT's CPU provider has no kernel for it

    a, b = torch.randn(4, dtype=torch.bfloat16), torch.randn(4, dtype=torch.bfloat16)
    assert torch.equal(compile_ort(g)(a, b), g(a, b))
    # refused up front by a probe session, as the kernel list would have refused it
    fb = metrics.fallbacks()
    assert "aten.mul.Tensor" in fb and any(r.startswith(Reason.NO_KERNEL) for r in fb["aten.mul.Tensor"]), fb
    assert metrics.counters()["ort_failures"] == 0


def test_session_refusal_names_the_missing_kernel():
    import onnx
    from onnx import TensorProto, helper

    def add(elem: int) -> bytes:
        x = helper.make_tensor_value_info("x", elem, [2])
        y = helper.make_tensor_value_info("y", elem, [2])
        graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [x], [y])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()

    assert kernels.session_refusal(add(TensorProto.FLOAT), ["CPUExecutionProvider"]) is None
    refusal = kernels.session_refusal(add(TensorProto.BFLOAT16), ["CPUExecutionProvider"])
    assert refusal is not None and "Add" in refusal, refusal
    assert onnx  # the helper module comes with onnx

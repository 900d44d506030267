"""ort-lazy's rewrites give their results the strides eager's kernels give theirs.

The rewrites (``ort_lazy.lowering.rewrites.DECOMPOSITIONS``) replace ops while AOTAutograd
traces the graph; ONNX has no strides, but the trace does: a view that eager's layout allows
fails to trace on another one, and the whole graph then runs in PyTorch (Hugging Face's Funnel
Transformer: ``slice_scatter`` into a permuted tensor, rewritten as a contiguous concatenation,
then a ``view``). Every op the rewrites cover that PyTorch's op database samples is traced with
them on contiguous and on permuted inputs, and its outputs' strides compared with eager's
(its first two samples by default, six in the full tier).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import compile_ort
from ort_lazy import metrics
from ort_lazy.lowering.rewrites import DECOMPOSITIONS


def _permuted(t: Any) -> Any:
    """The same values with the first and last dims swapped in memory (dense, not contiguous)."""
    if isinstance(t, torch.Tensor) and t.dim() >= 2:
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    return t


def _strides_differ(eager: torch.Tensor, traced: torch.Tensor) -> bool:
    """Different strides along a dim of more than one element, where eager's are dense."""
    if eager.shape != traced.shape or eager.numel() <= 1:
        return False
    if not torch._prims_common.is_non_overlapping_and_dense_or_false(eager):
        return False  # an overlapping or gapped result: no layout a concatenation could match
    dims = [d for d, n in enumerate(eager.shape) if n > 1]
    return [eager.stride(d) for d in dims] != [traced.stride(d) for d in dims]


def _op_infos() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    names = {op.__name__.split(".")[0] for op in DECOMPOSITIONS if hasattr(op, "__name__")}
    return [o for o in op_db if o.name in names or (o.aten_name or "") in names]


#: samples traced per op, and the fewest traces that must succeed: the first two by default,
#: six in the full tier (``--full-tier``)
SAMPLES = {"fast": (2, 350), "full": (6, 500)}


def test_rewritten_ops_keep_eagers_strides(request: pytest.FixtureRequest) -> None:
    infos = _op_infos()
    assert len(infos) > 50, "the op database no longer names the rewritten ops"
    samples, fewest = SAMPLES["full" if request.config.getoption("--full-tier") else "fast"]
    traced, different = 0, []
    for info in infos:
        if torch.float32 not in info.supported_dtypes("cpu"):
            continue
        for sample in list(info.sample_inputs("cpu", torch.float32))[:samples]:
            variants = [(sample.input, sample.args), (_permuted(sample.input), tuple(map(_permuted, sample.args)))]
            for x, args in variants:
                fn = (lambda op, a, k: lambda t: op(t, *a, **k))(info.op, args, sample.kwargs)
                try:
                    expected = fn(x)
                    got = make_fx(fn, decomposition_table=DECOMPOSITIONS)(x)(x)
                except Exception:  # what eager or tracing refuses is not this test's matter
                    continue
                traced += 1
                pairs = zip(*(o if isinstance(o, (tuple, list)) else [o] for o in (expected, got)))
                for e, g in pairs:
                    if isinstance(e, torch.Tensor) and isinstance(g, torch.Tensor) and _strides_differ(e, g):
                        different.append(f"{info.name}{tuple(e.shape)}: eager {e.stride()}, rewritten {g.stride()}")
    assert traced > fewest, traced
    assert not different, "\n".join(sorted(set(different)))


@pytest.mark.parametrize("op", ["slice_scatter", "select_scatter"])
def test_a_view_after_a_scatter_into_a_permuted_tensor_runs_on_ort(op: str) -> None:
    """Funnel's pattern: a write into a slice of a permuted tensor, then a ``view`` its eager
    layout allows. The graph compiles, runs on ORT and gives eager's values."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        base = x.permute(0, 2, 1) * 2  # dense, not contiguous
        if op == "slice_scatter":
            base[:, 1:3] = y
        else:
            base[:, 1] = y[:, 0]
        return base.permute(0, 2, 1).view(-1) + 1  # contiguous again in eager's layout

    x, y = torch.randn(2, 5, 4), torch.randn(2, 2, 5)
    metrics.reset()
    torch._dynamo.reset()
    got = compile_ort(fn)(x, y)
    torch.testing.assert_close(got, fn(x, y))
    counters = metrics.counters()
    assert counters["ort_runs"] >= 1 and counters.get("graph_failures", 0) == 0, metrics.fallbacks()
    assert not metrics.fallbacks(), metrics.fallbacks()

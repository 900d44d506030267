"""Load and endurance: many threads, many calls, changing shapes; memory and caches stay bounded."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from helpers import assert_ran_on_ort, compile_ort, run_in_threads
from ort_lazy.models import MLP
from ort_lazy.runtime.session_cache import session_cache

pytestmark = pytest.mark.slow


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_8_threads_x_500_calls_all_correct():
    torch.manual_seed(0)
    model = MLP(width=32, depth=2, out=8).eval()
    compiled = compile_ort(model)
    with torch.no_grad():
        compiled(torch.randn(4, 32))
    def worker(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for i in range(500):
                x = torch.randn(4, 32, generator=g) * (1 + i % 3)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)

    run_in_threads(worker)
    assert_ran_on_ort(8 * 500)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS read from /proc")
@pytest.mark.full
def test_20000_calls_memory_flat():
    model = MLP(width=32, depth=2, out=8).eval()
    compiled = compile_ort(model)
    x = torch.randn(8, 32)
    with torch.no_grad():
        for _ in range(2000):  # warm-up: allocator pools, caches
            compiled(x)
        gc.collect()
        before = _rss_mb()
        for _ in range(20000):
            compiled(x)
        gc.collect()
        grown = _rss_mb() - before
    assert grown < 5.0, f"resident memory grew {grown:.1f} MB over 20,000 calls"
    assert_ran_on_ort(22000)


def test_shapes_changing_every_call_stay_bounded():
    model = MLP(width=16, depth=1, out=4).eval()
    compiled = compile_ort(model)
    sizes = list(range(4, 60))
    with torch.no_grad():
        # batch 1 and 2 specialise, batch 3 compiles the symbolic graph: one-time costs (a
        # process's first symbolic compile allocates caches and imports, 24 MB once in CI
        # after other tests), done before the measured calls of every other size
        for b in (2, 1, 3):
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        gc.collect()
        before = _rss_mb()
        for b in sizes:
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        gc.collect()
        grown = _rss_mb() - before
    # batch 1 and batch 2 specialise, then one symbolic model serves every other size
    assert len(session_cache()) <= 3
    assert grown < 20.0, f"memory grew {grown:.1f} MB with changing shapes"


def test_session_cache_bound_respected_under_many_graphs():
    cache = session_cache()
    old = cache.capacity
    try:
        for n in range(1, 9):  # eight static graphs (dynamic off): eight distinct models
            torch._dynamo.reset()
            f = torch.compile(lambda x, n=n: torch.tanh(x) + n, backend="ort", dynamic=False, options={"cache_size": 3})
            f(torch.randn(n))
        assert len(cache) <= 3
    finally:
        cache.capacity = old

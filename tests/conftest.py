"""Shared fixtures, the ``--shards N --shard I`` split used by build.py and CI, and the two tiers.

The default run (``pytest -n 2 tests``, what ``build.py --test`` and ``.ci/run`` run) is the
fast tier, sized for CI's 2 cores: every test file runs its essential tests (each front door,
each feature, the parity checks that show ORT ran), and heavy parametrizations a representative
subset: one or two dtypes (float32, and the integer or half type a check is about), one of each
kind, every third case of long case lists, the zoo's fast models for plain inference and
training and one model per variant (``zoo.FAST``, ``FAST_BY_KIND`` in ``models/test_zoo.py``),
and of the OpInfo suite one float32 case of half of the ops: the forward case of a third of
them, the backward case of a sixth (``opinfo/selection.py``).

The full tier is everything: ``--full-tier`` or ``ORT_LAZY_FULL_TIER=1`` (``build.py --test
--full``; CI's ``full`` job, in 8 shards) runs every test marked ``full`` (on a test or on one
``pytest.param``; ``helpers.tiered`` marks the rest of a parametrization), the whole model zoo
(also alone: ``--zoo-full`` or ``ORT_LAZY_ZOO_FULL=1``) and every OpInfo case (``--opinfo=full``;
``--opinfo=fast`` keeps the fast OpInfo subset in the full tier). Tests outside the default run
show as skipped with the option that runs them. A few tests take less of their input by default
and all of it in the full tier (``test_rewrite_layouts.py``: two samples per op instead of six).
Nothing is only in the default run: the full tier holds every test and every case."""

from __future__ import annotations

import gc
import hashlib
import os

import pytest

# the OpInfo parity suite's options and result collection (tests/opinfo)
pytest_plugins = ["opinfo.plugin"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ort-lazy sharding")
    group.addoption("--shards", "--num-shards", dest="shards", type=int, default=1, help="split the suite into N shards")
    group.addoption("--shard", "--shard-id", dest="shard", type=int, default=0, help="run shard I (0-based)")
    zoo = parser.getgroup("ort-lazy model zoo")
    zoo.addoption(
        "--zoo-full",
        action="store_true",
        default=os.environ.get("ORT_LAZY_ZOO_FULL", "") not in ("", "0"),
        help="also run the zoo tests marked zoo_full (default: only the fast subset; env ORT_LAZY_ZOO_FULL=1)",
    )
    group.addoption(
        "--full-tier",
        action="store_true",
        default=os.environ.get("ORT_LAZY_FULL_TIER", "") not in ("", "0"),
        help="also run the tests marked full and the whole zoo (env ORT_LAZY_FULL_TIER=1)",
    )


#: Python's cyclic garbage collector in the test processes: a young-generation collection every
#: 10000 net allocations instead of every 700. Tracing and compiling a graph allocates millions
#: of short-lived objects, and with the default the collector took a fifth of a compiling
#: test's CPU time (measured: 4.2 of 19.8 CPU seconds; 1.2 of 15.9 with this). Cyclic garbage
#: is still collected, a little later; tests that need it gone call ``gc.collect()``.
GC_THRESHOLD = (10000, 20, 20)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "zoo_full: model-zoo test outside the fast subset (opt in with --zoo-full)")
    config.addinivalue_line("markers", "full: test outside the fast subset .ci/run takes (opt in with --full-tier)")
    gc.set_threshold(*GC_THRESHOLD)


def shard_of(nodeid: str, shards: int) -> int:
    """Stable shard index of a test id (same on every machine and Python)."""
    return int(hashlib.sha256(nodeid.encode()).hexdigest(), 16) % shards


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    full_tier = config.getoption("--full-tier")
    if not (config.getoption("--zoo-full") or full_tier):
        opt_in = pytest.mark.skip(reason="full model zoo: opt in with --zoo-full or ORT_LAZY_ZOO_FULL=1")
        for item in items:
            if item.get_closest_marker("zoo_full"):
                item.add_marker(opt_in)
    if not full_tier:
        opt_in = pytest.mark.skip(reason="full tier: opt in with --full-tier or ORT_LAZY_FULL_TIER=1")
        for item in items:
            if item.get_closest_marker("full"):
                item.add_marker(opt_in)
    shards = config.getoption("--shards")
    if shards <= 1:
        return
    shard = config.getoption("--shard")
    keep, drop = [], []
    for item in items:
        (keep if shard_of(item.nodeid, shards) == shard else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


@pytest.fixture(autouse=True)
def _fresh_metrics():
    """Every test starts with zeroed counters, no cached ORT sessions and no kept exports."""
    from ort_lazy import metrics
    from ort_lazy.export.cache import clear_shared_models
    from ort_lazy.runtime.session_cache import session_cache

    metrics.reset()
    session_cache().clear()
    clear_shared_models()
    yield


@pytest.fixture(autouse=True)
def _bridge_left_as_found():
    """A test that turns the TorchScript/LazyTensor pass on turns it off again: a pass left on
    for ``lazy`` keeps fusing and running groups on ORT in later tests that turned ``jit`` off
    (their counters then depend on which tests ran before on the same worker)."""
    from ort_lazy.runtime import bridge

    before = bridge.users()
    yield
    left = bridge.users() - before
    if left:
        for user in left:
            bridge.deactivate(user)
        pytest.fail(f"the test left the bridge's pass on for {sorted(left)}: turn it off at its end")


@pytest.fixture
def decomposed_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU inference graphs decompose attention (matrix products and the guarded softmax)
    instead of keeping it whole for ONNX's ``Attention``: for the tests of the decomposed form."""
    from ort_lazy.export import attention

    monkeypatch.setattr(attention, "FUSED_ON_CPU", False)


@pytest.fixture
def exact_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU models hold the exact forms GPU models have (max pooling's NaN rule in an ``If``)
    instead of fast forms with check outputs: for the tests of those forms on the CPU."""
    from ort_lazy.export import fx

    monkeypatch.setattr(fx, "CHECKED_FORMS_ON_CPU", False)

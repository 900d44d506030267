"""DistributedDataParallel training with the ORT backend: two gloo processes on CPU.

Every test spawns its own two ranks (``torch.multiprocessing``, spawn start method) that meet
through a file store in the test's ``tmp_path``: no fixed port, so parallel pytest workers
cannot collide. Each rank writes its results to a file that the test compares; a hard
deadline kills the ranks so a stuck collective cannot hang the suite.
"""

from __future__ import annotations

import copy
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import forkserver
from helpers import assert_close

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available"
)

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 2
STEPS = 20
LR = 0.05
# Every parameter tensor of the small models fills a DDP bucket on its own, so both the
# reducer and dynamo's DDPOptimizer see several buckets and the compiled graph is split.
BUCKET_BYTES = 4096
BUCKET_CAP_MB = BUCKET_BYTES / 2**20
RANK_TIMEOUT_S = 240.0
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
# One intra-op thread per rank: two ranks (and possibly two pytest workers) share the cores.
ORT_OPTIONS = {"session_options": {"intra_op_num_threads": 1}}


class MLP(torch.nn.Module):
    """Three linear layers; a user-defined module so dynamo traces its forward."""

    def __init__(self, d_in: int = 16, hidden: int = 64, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.nn.functional.gelu(self.fc2(torch.relu(self.fc1(x)))))


class Encoder(torch.nn.Module):
    """An input projection followed by one ``TransformerEncoderLayer`` (d_model 32, no dropout)."""

    def __init__(self, d_model: int = 32, nhead: int = 4, ff: int = 64) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)
        self.layer = torch.nn.TransformerEncoderLayer(d_model, nhead, ff, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.proj(x))


def make_model(kind: str) -> torch.nn.Module:
    """The same initial weights on every rank (DDP broadcasts rank 0's anyway)."""
    torch.manual_seed(0)
    return MLP() if kind == "mlp" else Encoder()


def batch(kind: str, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-specific inputs and targets: the ranks only agree if DDP averages their gradients."""
    g = torch.Generator().manual_seed(1000 * (rank + 1) + step)
    if kind == "mlp":
        return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    return torch.randn(4, 6, 32, generator=g), torch.randn(4, 6, 32, generator=g)


def train(model: torch.nn.Module, step_fn: Callable[[torch.Tensor], torch.Tensor], kind: str, rank: int) -> list[float]:
    """``STEPS`` SGD steps of MSE loss; returns the per-step losses."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = batch(kind, rank, step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(step_fn(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _init_group(rank: int, world_size: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )


def _ddp_worker(rank: int, world_size: int, store: str, out_dir: str, kind: str, wrap: str) -> None:
    """One rank: the same DDP training in eager PyTorch, then with ``torch.compile(backend="ort")``.

    ``wrap`` is ``compile_ddp`` for ``torch.compile(DDP(model))`` or ``ddp_compile`` for
    ``DDP(torch.compile(model))``; dynamo's DDPOptimizer splits the graph either way.
    """
    _init_group(rank, world_size, store)
    try:
        from torch._dynamo.utils import counters as dynamo_counters

        from ort_lazy import metrics

        # DDPOptimizer sizes its first bucket with this default (1 MiB) whatever bucket_cap_mb
        # says, and refuses a first bucket larger than the others: lower it to the tiny cap.
        dist._DEFAULT_FIRST_BUCKET_BYTES = BUCKET_BYTES
        base = make_model(kind)

        eager_model = copy.deepcopy(base)
        eager_losses = train(eager_model, DDP(eager_model, bucket_cap_mb=BUCKET_CAP_MB), kind, rank)

        torch._dynamo.reset()
        dynamo_counters.clear()
        metrics.reset()
        ort_model = copy.deepcopy(base)
        if wrap == "compile_ddp":
            step_fn = torch.compile(DDP(ort_model, bucket_cap_mb=BUCKET_CAP_MB), backend="ort", options=ORT_OPTIONS)
        else:
            step_fn = DDP(torch.compile(ort_model, backend="ort", options=ORT_OPTIONS), bucket_cap_mb=BUCKET_CAP_MB)
        ort_losses = train(ort_model, step_fn, kind, rank)

        result = {
            "eager_params": [p.detach().clone() for p in eager_model.parameters()],
            "ort_params": [p.detach().clone() for p in ort_model.parameters()],
            "eager_losses": eager_losses,
            "ort_losses": ort_losses,
            "counters": metrics.counters(),
            "fallbacks": metrics.fallbacks(),
            # graphs dynamo handed to AOTAutograd: one per DDPOptimizer bucket
            "aot_graphs": dynamo_counters["aot_autograd"]["total"],
        }
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        _phase(out_dir, rank, "saved")
    finally:
        dist.destroy_process_group()
    _phase(out_dir, rank, "group destroyed")
    # ort-lazy's own teardown (its sessions and their thread pools) runs here, where a fault
    # would fail the rank; the interpreter's native teardown is skipped: gloo's worker threads
    # can abort it under load ("terminate called without an active exception", a PyTorch
    # teardown race). A full natural exit is test_example_under_torchrun's.
    from ort_lazy.runtime.session_cache import session_cache

    session_cache().clear()
    _phase(out_dir, rank, "ort-lazy released")
    os._exit(0)


def _phase(out_dir: str, rank: int, name: str) -> None:
    """Record that ``rank`` reached ``name``: a rank that dies says how far it got."""
    with open(os.path.join(out_dir, f"rank{rank}.phases"), "a") as f:
        f.write(name + "\n")


def run_ranks(worker: Callable[..., None], tmp_path: Path, *args: Any) -> list[dict[str, Any]]:
    """Spawn ``WORLD_SIZE`` ranks of ``worker(rank, world_size, store, out_dir, *args)``.

    Returns each rank's saved result; kills the ranks and fails after ``RANK_TIMEOUT_S``.
    """
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    store = str(tmp_path / "store")
    context = mp.start_processes(
        worker, args=(WORLD_SIZE, store, str(out_dir), *args), nprocs=WORLD_SIZE, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + RANK_TIMEOUT_S

    def phases() -> str:
        files = [out_dir / f"rank{r}.phases" for r in range(WORLD_SIZE)]
        return "; ".join(
            f"rank {r}: {', '.join(f.read_text().splitlines()) if f.exists() else 'none'}" for r, f in enumerate(files)
        )

    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                pytest.fail(f"ranks did not finish within {RANK_TIMEOUT_S:.0f}s ({phases()})")
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        raise AssertionError(f"{e} after the phases {phases()}") from e
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]


@pytest.mark.parametrize(("kind", "wrap"), [("mlp", "compile_ddp"), pytest.param("transformer", "ddp_compile", marks=pytest.mark.full)])
def test_ddp_compiled_matches_eager(kind: str, wrap: str, tmp_path: Path) -> None:
    """20 SGD steps of DDP on rank-specific data: ranks agree, ORT matches eager, ORT ran everywhere."""
    results = run_ranks(_ddp_worker, tmp_path, kind, wrap)
    for rank, r in enumerate(results):
        c = r["counters"]
        print(f"{kind} rank {rank}: counters {c} fallbacks {r['fallbacks']} dynamo graphs {r['aot_graphs']}")
        # ORT really ran on this rank, at least once per step.
        assert c["ort_runs"] >= STEPS, (rank, c)
        assert c["regions_on_ort"] > 0 and c["sessions_created"] > 0, (rank, c)
        assert c["ort_failures"] == 0 and c["export_failures"] == 0, (rank, c, r["fallbacks"])
        assert c["fallback_ops"] == sum(n for reasons in r["fallbacks"].values() for n in reasons.values())
        # DDPOptimizer split the graph at bucket boundaries, and every piece went through the
        # ort backend's partitioner: a forward and a backward graph each.
        assert r["aot_graphs"] >= 2, (rank, r["aot_graphs"])
        assert c["graphs_compiled"] == 2 * r["aot_graphs"], (rank, c, r["aot_graphs"])
        # Rank-specific data: losses differ between ranks, and per rank ORT follows eager.
        assert_close(torch.tensor(r["ort_losses"]), torch.tensor(r["eager_losses"]), rtol=1e-4, atol=1e-5)
        assert_close(r["ort_params"], r["eager_params"], rtol=1e-4, atol=1e-5)
    assert results[0]["eager_losses"][0] != results[1]["eager_losses"][0]
    # DDP kept the replicas in sync: identical parameters on every rank, eager and compiled.
    for mode in ("eager_params", "ort_params"):
        for p0, p1 in zip(results[0][mode], results[1][mode]):
            assert torch.equal(p0, p1), mode
    # ... and training moved them.
    initial = list(make_model(kind).parameters())
    assert any(not torch.equal(p, q) for p, q in zip(results[0]["ort_params"], initial))


# -- LazyTensor + DDP ----------------------------------------------------------------------
#
# LazyTensor parameters cannot be trained with DDP: ProcessGroupGloo (like NCCL) accepts only
# CPU/CUDA tensors. DDP's constructor already gathers parameter shapes across ranks and fails
# there, before any step; and the in-place collectives DDP's reducer relies on do not
# communicate for ``device="lazy"`` tensors (all_reduce returns each rank's own value). For
# multi-process training use ``torch.compile(backend="ort")`` (dynamo), tested above.


def _bridge_error() -> str | None:
    from ort_lazy.frontends import jit as jit_frontend

    try:
        jit_frontend.load_bridge()
    except jit_frontend.BridgeUnavailableError as e:
        return str(e)
    return None


def _lazy_worker(rank: int, world_size: int, store: str, out_dir: str) -> None:
    """One rank: try DDP on a lazy module and the collectives DDP needs on lazy tensors."""
    _init_group(rank, world_size, store)
    try:
        import logging

        import torch._lazy

        import ort_lazy

        records: list[str] = []

        class _Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record.getMessage())

        logging.getLogger("ort_lazy").addHandler(_Keep())
        ort_lazy.lazy.init()
        result: dict[str, Any] = {"warnings": records}
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to("lazy")
        try:
            DDP(model)
            result["ddp_error"] = None
        except RuntimeError as e:
            result["ddp_error"] = str(e)

        t = torch.full((3,), float(rank + 1), device="lazy")
        dist.all_reduce(t)
        torch._lazy.mark_step()
        result["all_reduce"] = t.cpu().tolist()

        # The same collective on CPU tensors communicates: the process group itself is sound.
        c = torch.full((3,), float(rank + 1))
        dist.all_reduce(c)
        result["all_reduce_cpu"] = c.tolist()
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    # The DDP constructor that failed inside gloo can leave a native thread behind that aborts
    # interpreter teardown ("terminate called without an active exception"). The results are
    # saved: leave without running native destructors.
    os._exit(0)


@pytest.mark.bridge
@pytest.mark.full
def test_lazy_tensor_ddp_is_rejected(tmp_path: Path) -> None:
    """DDP on LazyTensor parameters fails at construction; gloo all_reduce on lazy tensors is a no-op."""
    error = _bridge_error()
    if error is not None:
        pytest.skip(f"bridge not built: {error}")
    results = run_ranks(_lazy_worker, tmp_path)
    total = float(sum(range(1, WORLD_SIZE + 1)))
    for rank, r in enumerate(results):
        assert r["ddp_error"] is not None, "DDP accepted lazy parameters: revisit LazyTensor + DDP support"
        assert re.search(r"ProcessGroupGloo::\w+: invalid tensor type", r["ddp_error"]), r["ddp_error"]
        assert "device=lazy" in r["ddp_error"], r["ddp_error"]
        assert r["all_reduce_cpu"] == [total] * 3
        # ort_lazy.lazy.init() said so up front, once, under an initialized process group
        assert sum("LazyTensor does not support torch.distributed" in w for w in r["warnings"]) == 1
        # Not reduced: each rank keeps its own value.
        assert r["all_reduce"] == [float(rank + 1)] * 3, (
            "all_reduce on lazy tensors now communicates: revisit LazyTensor + DDP support",
            r["all_reduce"],
        )


# -- the example, under torchrun -----------------------------------------------------------

METRICS_LINE = re.compile(r"\[rank (\d)\] ort-lazy: ort_runs=(\d+) [^[]*?fallback_ops=(\d+)")


@pytest.mark.full
def test_example_under_torchrun() -> None:
    """``examples/ddp_train.py`` under torchrun (2 ranks, gloo): exits 0, ORT ran on both ranks."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD_SIZE),
        str(REPO / "examples" / "ddp_train.py"), "--steps", "3", "--model", "mlp",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=RANK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {RANK_TIMEOUT_S:.0f}s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    runs = {int(m.group(1)): int(m.group(2)) for m in METRICS_LINE.finditer(output)}
    assert sorted(runs) == list(range(WORLD_SIZE)), output[-4000:]
    assert all(n > 0 for n in runs.values()), runs
    assert len(re.findall(r"\[rank \d\] step 3/3 loss \d", output)) == WORLD_SIZE, output[-4000:]


_UNCOMPILED_DDP = """
import logging, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
from ort_lazy import metrics

class Mine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

def seq():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))

form = sys.argv[2]
model = {"compile(DDP(Sequential))": lambda: torch.compile(DDP(seq()), backend="ort"),
         "compile(DDP(Mine))": lambda: torch.compile(DDP(Mine()), backend="ort"),
         "DDP(compile(Sequential))": lambda: DDP(torch.compile(seq(), backend="ort"))}[form]()
model(torch.randn(4, 8)).sum().backward()
c = metrics.counters()
print("RESULT", c["graphs_compiled"], c["ddp_uncompiled"], flush=True)
dist.destroy_process_group()
# as in the training ranks above: ort-lazy's own teardown runs here, then the interpreter's
# native teardown is skipped (gloo's worker threads can abort it under load, "terminate called
# without an active exception": once in about 60 runs of this script, a PyTorch teardown race)
from ort_lazy.runtime.session_cache import session_cache
session_cache().clear()
import os
os._exit(0)
"""


@pytest.mark.parametrize(
    "form,compiles,warns",
    [("compile(DDP(Sequential))", False, True), ("compile(DDP(Mine))", True, False), ("DDP(compile(Sequential))", True, False)],
)
def test_compiled_ddp_that_compiles_nothing_is_named(tmp_path: Path, form: str, compiles: bool, warns: bool) -> None:
    script = tmp_path / "run.py"
    script.write_text(_UNCOMPILED_DDP)
    out = forkserver.run([sys.executable, str(script), str(tmp_path / "store"), form], timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    graphs, flagged = (int(v) for v in re.search(r"RESULT (\d+) (\d+)", out.stdout).groups())
    assert (graphs > 0) == compiles and (flagged > 0) == warns, out.stdout
    advice = "DDP(torch.compile(model, backend='ort'))"
    assert (out.stdout.count(advice) == 1) == warns, out.stdout

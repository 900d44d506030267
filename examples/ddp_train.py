"""Data-parallel training with ``torch.compile(backend="ort")`` inside DistributedDataParallel.

Launch one process per rank with torchrun::

    torchrun --nproc_per_node 2 examples/ddp_train.py --steps 20 --model transformer

On CPU the ranks talk over gloo and ORT runs on the CPU execution provider. With CUDA, each
rank takes the GPU named by ``LOCAL_RANK``, the ranks talk over NCCL and ORT runs on the CUDA
execution provider of that same GPU (the backend picks the device of the graph's tensors).

Every rank trains on its own synthetic data; DDP averages the gradients, so the replicas stay
identical. At the end each rank prints the ort-lazy counters that show ORT ran, and the ops
(if any) that stayed in PyTorch.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ort_lazy


class MLP(torch.nn.Module):
    """A small multi-layer perceptron."""

    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.nn.functional.gelu(self.fc2(torch.relu(self.fc1(x)))))


class Encoder(torch.nn.Module):
    """An input projection, one ``TransformerEncoderLayer`` and an output head."""

    def __init__(self, d_model: int, nhead: int = 4) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)
        self.layer = torch.nn.TransformerEncoderLayer(d_model, nhead, 2 * d_model, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.proj(x)))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="SGD steps (default 20)")
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    p.add_argument("--hidden", type=int, default=64, help="MLP width / transformer d_model (default 64)")
    p.add_argument("--batch-size", type=int, default=16, help="per-rank batch size (default 16)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP bucket size; dynamo splits the compiled graph at bucket boundaries (>= 1)")
    p.add_argument("--dist-backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: NCCL when CUDA is available, else gloo")
    p.add_argument("--log-every", type=int, default=1, help="print the loss every N steps")
    return p.parse_args(argv)


def setup(choice: str) -> tuple[torch.device, str]:
    """Join the process group torchrun describes; returns this rank's device and the backend used."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and choice != "gloo"
    if choice == "nccl" and not torch.cuda.is_available():
        raise SystemExit("--dist-backend nccl needs CUDA")
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device, "nccl"
    dist.init_process_group("gloo")
    return torch.device("cpu"), "gloo"


def make_model(kind: str, hidden: int) -> torch.nn.Module:
    """The model to train (same initial weights on every rank; DDP broadcasts rank 0's anyway)."""
    torch.manual_seed(0)
    return MLP(32, hidden, 8) if kind == "mlp" else Encoder(hidden)


def make_batch(kind: str, hidden: int, batch_size: int, rank: int, step: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-specific inputs; targets from a fixed random teacher so the loss can go down."""
    g = torch.Generator().manual_seed(10_000 * (rank + 1) + step)
    teacher = torch.Generator().manual_seed(1)
    if kind == "mlp":
        x = torch.randn(batch_size, 32, generator=g)
        y = torch.sin(x @ torch.randn(32, 8, generator=teacher))
    else:
        x = torch.randn(batch_size, 8, hidden, generator=g)
        y = torch.tanh(x @ torch.randn(hidden, hidden, generator=teacher) / hidden**0.5)
    return x.to(device), y.to(device)


def replicas_identical(model: torch.nn.Module) -> bool:
    """Whether every rank holds exactly rank 0's parameters."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    same = torch.tensor([1 if torch.equal(flat, reference) else 0], device=flat.device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


def main(argv: Sequence[str] | None = None) -> int:
    """Train; returns the exit status (1 when ORT did not run on this rank)."""
    args = parse_args(argv)
    device, backend = setup(args.dist_backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    tag = f"[rank {rank}]"
    try:
        model = make_model(args.model, args.hidden).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
        # ORT's threads follow torch.get_num_threads() (torchrun sets OMP_NUM_THREADS=1 per rank)
        compiled = torch.compile(ddp, backend="ort")
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        if rank == 0:
            print(f"{tag} {world} ranks, {backend}, {device.type}, model {args.model}, {args.steps} steps", flush=True)
        for step in range(1, args.steps + 1):
            x, y = make_batch(args.model, args.hidden, args.batch_size, rank, step, device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(compiled(x), y)
            loss.backward()
            opt.step()
            if step % args.log_every == 0 or step == args.steps:
                print(f"{tag} step {step}/{args.steps} loss {loss.item():.5f}", flush=True)

        in_sync = replicas_identical(model)
        c = ort_lazy.metrics.counters()
        print(
            f"{tag} ort-lazy: ort_runs={c['ort_runs']} sessions_created={c['sessions_created']} "
            f"graphs_compiled={c['graphs_compiled']} regions_on_ort={c['regions_on_ort']} "
            f"fallback_ops={c['fallback_ops']} replicas_identical={in_sync}",
            flush=True,
        )
        for op, reasons in ort_lazy.metrics.fallbacks().items():
            print(f"{tag}   left to PyTorch: {op} {reasons}", flush=True)
        # release the compiled graphs and DDP's reference to the process group before it is
        # destroyed, so no communication thread outlives it into interpreter teardown
        del compiled, ddp, opt
        torch._dynamo.reset()
        gc.collect()
        if c["ort_runs"] == 0:
            print(f"{tag} ORT did not run", file=sys.stderr, flush=True)
            return 1
        return 0 if in_sync else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

"""A training step end to end on one backend: a GPT-like transformer under FSDP2 or DDP, its median
step time, tokens/s, peak memory, exposed communication time and losses.

Compare backends each in its own processes, runs interleaved (it starts torchrun itself):

    python -m benchmarks.interleaved --module benchmarks.train_step --nproc 4 --repeats 3 \\
        --baseline nccl --out results/ --run nccl=nccl --run nccl_core=nccl_core

or alone: ``python -m torch_nccl_core.launch --nproc-per-node 4 -m benchmarks.train_step
--backends nccl_core --out results/``.

Rows (OUT/train_step.csv), per (variant, op, bytes): variant ``<fsdp2|ddp>-<config>``, op
``step``, bytes the parameters' (bf16); time_us the median step time over the timed steps (the
ranks' max), host_us the median host time of a step before its synchronize; and tokens_per_s,
peak_mem_mb (the ranks' max), exposed_comm_ms (per step: time a communication kernel ran while no
compute kernel did, from a profile of three steps; 0 without a GPU) and loss (the last step's,
rank 0's: the same seed and data on every backend, so backends agree to bf16 rounding).
Configurations (``--configs``): ``comm`` (1 x 1024 tokens per rank: communication-bound) and
``compute`` (8 x 1024). FSDP2: bf16 parameters, fp32 gradient reduction, each block sharded;
DDP: bf16 autocast, 25 MB buckets.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .cli import (
    add_backend_arguments,
    add_init_backend_argument,
    comma_list,
    run_one_backend,
)
from .timing import rank_max

CONFIGS = {"comm": 1, "compute": 8}  # sequences of --seq tokens per rank and step
PARALLEL = ("fsdp2", "ddp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_backend_arguments(p, "the backend measured (one)")
    add_init_backend_argument(p)
    p.add_argument("--parallel", type=comma_list(list(PARALLEL)), default=list(PARALLEL))
    p.add_argument("--configs", type=comma_list(list(CONFIGS)), default=list(CONFIGS))
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    args = p.parse_args(argv)
    if len(args.backends) != 1:
        p.error("--backends names one backend (compare backends with benchmarks.interleaved)")
    if args.width % args.heads:
        p.error("--heads must divide --width")
    args.backend_labels = args.backends
    return args


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).unbind(2)
        a = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(nn.Module):
    """GPT-like: embedding, blocks, final norm and an untied output projection."""

    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.width)
        self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.layers))
        self.norm, self.head = nn.LayerNorm(args.width), nn.Linear(args.width, args.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def wrapped(args, parallel: str, group, device: torch.device) -> tuple[nn.Module, int]:
    """The model under `parallel` over `group`, and its parameter count."""
    torch.manual_seed(0)  # the same initial weights on every rank and backend
    with device:
        model = Model(args)
    params = sum(p.numel() for p in model.parameters())
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, process_group=group, bucket_cap_mb=25)
        return ddp, params
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy), params


def batch(args, sequences: int, step: int, device: torch.device) -> torch.Tensor:
    """Tokens of this rank's batch at `step`: the same on every backend."""
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randint(args.vocab, (sequences, args.seq + 1), generator=g).to(device)


def train_step(model, optimizer, tokens: torch.Tensor, parallel: str) -> torch.Tensor:
    autocast = parallel == "ddp" and tokens.is_cuda
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# Lower-case parts of communication kernels' names: NCCL's, the package's all-reduce kernels, and
# the copy engine's peer copies.
COMM_KERNELS = ("nccldevkernel", "allreducekernel", "ptop")


def exposed_comm_ms(events) -> float:
    """Time in which a communication kernel ran and no other kernel did, in ms (the union of
    communication intervals less the union of compute ones)."""

    def union(intervals):
        merged = []
        for start, end in sorted(intervals):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return merged

    comm, compute = [], []
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA or e.time_range.elapsed_us() <= 0:
            continue
        span = (e.time_range.start, e.time_range.end)
        (comm if any(k in e.name.lower() for k in COMM_KERNELS) else compute).append(span)
    busy = union(compute)
    exposed = 0.0
    for start, end in union(comm):
        covered = sum(max(0, min(end, b) - max(start, a)) for a, b in busy)
        exposed += end - start - covered
    return exposed / 1e3


def measure(args, parallel: str, config: str, group, device, sync) -> dict:
    model, params = wrapped(args, parallel, group, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    sequences = CONFIGS[config]
    steps = [batch(args, sequences, i, device) for i in range(args.warmup + args.steps)]
    for tokens in steps[: args.warmup]:
        train_step(model, optimizer, tokens, parallel)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, hosts, loss = [], [], None
    for tokens in steps[args.warmup :]:
        rank_max(0.0)  # every rank starts the step together
        start = time.perf_counter()
        loss = train_step(model, optimizer, tokens, parallel)
        hosts.append(time.perf_counter() - start)
        sync()
        times.append(time.perf_counter() - start)
    (step_s,) = rank_max(statistics.median(times))
    exposed = 0.0
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for tokens in steps[-3:]:
                train_step(model, optimizer, tokens, parallel)
            sync()
        (exposed,) = rank_max(exposed_comm_ms(prof.events()) / 3)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    (peak,) = rank_max(peak)
    row = {
        "variant": f"{parallel}-{config}",
        "op": "step",
        "bytes": params * 2,
        "time_us": step_s * 1e6,
        "host_us": statistics.median(hosts) * 1e6,
        "tokens_per_s": dist.get_world_size() * sequences * args.seq / step_s,
        "peak_mem_mb": peak,
        "exposed_comm_ms": exposed,
        "loss": float(loss),
    }
    print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    del model, optimizer
    return row


def measure_all(args, group, device, sync) -> list[dict]:
    return [
        measure(args, parallel, config, group, device, sync)
        for parallel in args.parallel
        for config in args.configs
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    about = f"{args.layers} layers, width {args.width}, {args.seq} tokens per sequence"
    run_one_backend(args, measure_all, "train_step", "Training step", about)


if __name__ == "__main__":
    main()

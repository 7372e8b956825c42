"""Where the copy-engine reduce-scatter starts to win (Options.copy_engine_reduce_scatter).

Run from the repository root, one process per GPU:

    torchrun --nproc-per-node=2 -m benchmarks.reduce_scatter_crossover

For output sizes 1 MiB to 512 MiB (float32) it times ``reduce_scatter_tensor`` on the built-in
``nccl`` backend and on two ``nccl_core`` groups, one with the copy-engine path forced on and one
with it off, and prints their bus bandwidths (best of 3 measurements), the ratios, and whether the
copy-engine result equals the built-in one bit for bit (docs/bench/reduce_scatter_crossover.md).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import torch_nccl_core

from .cases import ReduceScatter

OUTPUT_MIB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def new_groups() -> dict[str, dist.ProcessGroup]:
    """builtin: torch's nccl; ce / nccl: nccl_core with the copy-engine path forced on / off."""

    def core(copy_engine: bool) -> dist.ProcessGroup:
        options = torch_nccl_core.Options(copy_engine_reduce_scatter=copy_engine)
        return dist.new_group(backend="nccl_core", pg_options=options)

    return {"builtin": dist.new_group(backend="nccl"), "ce": core(True), "nccl": core(False)}


def time_of(group: dist.ProcessGroup, out: torch.Tensor, x: torch.Tensor) -> float:
    """Seconds per reduce_scatter_tensor, over a back-to-back loop of at most ~2 GB of input."""
    iters = max(5, min(200, int(2e9 / x.nbytes)))
    for _ in range(3):
        dist.reduce_scatter_tensor(out, x, group=group)
    torch.cuda.synchronize()
    dist.barrier(group=group)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.reduce_scatter_tensor(out, x, group=group)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def compare(groups: dict[str, dist.ProcessGroup], mib: int) -> str:
    """One output size: each group's bus bandwidth, the ratios, and whether ce equals builtin."""
    world = dist.get_world_size()
    m = mib * (1 << 20) // 4
    x = torch.randn(m * world, device="cuda")
    out = torch.empty(m, device="cuda")
    best = {k: min(time_of(g, out, x) for _ in range(3)) for k, g in groups.items()}
    bus = {k: x.nbytes / v * ReduceScatter.bus_factor(world) / 1e9 for k, v in best.items()}
    ref = torch.empty_like(out)
    dist.reduce_scatter_tensor(ref, x, group=groups["builtin"])
    dist.reduce_scatter_tensor(out, x, group=groups["ce"])
    torch.cuda.synchronize()
    ok = torch.equal(out, ref)
    return (
        f"out {mib:4d} MiB  builtin {bus['builtin']:6.1f}  nccl_core/nccl {bus['nccl']:6.1f}  "
        f"nccl_core/ce {bus['ce']:6.1f} GB/s  ce/builtin {bus['ce'] / bus['builtin']:.3f}  "
        f"ce/nccl {bus['ce'] / bus['nccl']:.3f}  equal={ok}"
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    dist.init_process_group("cpu:gloo,cuda:nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    groups = new_groups()
    for mib in OUTPUT_MIB:
        line = compare(groups, mib)
        if rank == 0:
            print(line, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

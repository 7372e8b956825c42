"""Where the copy-engine reduce-scatter starts to win (Options.copy_engine_reduce_scatter).

Run (one process per GPU):

    torchrun --nproc-per-node=2 benchmarks/reduce_scatter_crossover.py

For output sizes 1 MiB to 512 MiB (float32) it times ``reduce_scatter_tensor`` on the built-in
``nccl`` backend and on two ``nccl_core`` groups, one with the copy-engine path forced on and one
with it off, and prints their bus bandwidths (best of 3 measurements), the ratios, and whether the
copy-engine result equals the built-in one bit for bit. The size from which ``nccl_core`` takes
the path by default (``CopyEngineReduceScatter::kMinOutputBytes``) comes from this table
(docs/bench/reduce_scatter_crossover.md).
"""

import time

import torch
import torch.distributed as dist

import torch_nccl_core

dist.init_process_group("cpu:gloo,cuda:nccl")
r, n = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(r)
groups = {
    "builtin": dist.new_group(backend="nccl"),
    "ce": dist.new_group(
        backend="nccl_core",
        pg_options=torch_nccl_core.Options(copy_engine_reduce_scatter=True),
    ),
    "nccl": dist.new_group(
        backend="nccl_core",
        pg_options=torch_nccl_core.Options(copy_engine_reduce_scatter=False),
    ),
}


def t_of(g, out, x):
    iters = max(5, min(200, int(2e9 / x.nbytes)))
    for _ in range(3):
        dist.reduce_scatter_tensor(out, x, group=g)
    torch.cuda.synchronize()
    dist.barrier(group=g)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        dist.reduce_scatter_tensor(out, x, group=g)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


for mib in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
    m = mib * (1 << 20) // 4
    x = torch.randn(m * n, device="cuda")
    out = torch.empty(m, device="cuda")
    best = {k: min(t_of(g, out, x) for _ in range(3)) for k, g in groups.items()}
    bus = {k: x.nbytes / v * (n - 1) / n / 1e9 for k, v in best.items()}
    ref = torch.empty_like(out)
    dist.reduce_scatter_tensor(ref, x, group=groups["builtin"])
    dist.reduce_scatter_tensor(out, x, group=groups["ce"])
    torch.cuda.synchronize()
    ok = torch.equal(out, ref)
    if r == 0:
        print(
            f"out {mib:4d} MiB  builtin {bus['builtin']:6.1f}  nccl_core/nccl {bus['nccl']:6.1f}  "
            f"nccl_core/ce {bus['ce']:6.1f} GB/s  ce/builtin {bus['ce'] / bus['builtin']:.3f}  "
            f"ce/nccl {bus['ce'] / bus['nccl']:.3f}  equal={ok}",
            flush=True,
        )
dist.destroy_process_group()

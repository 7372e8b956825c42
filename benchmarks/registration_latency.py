"""Is any op slower on registered memory than on plain memory? One op's latency, variants in turn.

Run from the repository root, one process per GPU:

    torchrun --nproc-per-node=2 -m benchmarks.registration_latency --out OUT \\
        [--backends nccl,nccl_core] [--variants plain,nccl_mem,window] [--max-bytes 8M] \\
        [--calls 500]

Below a few MiB an op costs tens of microseconds, mostly host time, and back-to-back loops of one
variant after another (benchmarks.collectives) see that host time drift by up to 30% from one
loop to the next. Here the memory variants of one (backend, op, size) take turns call by call, in
a rotating order (plain, nccl_mem, window; nccl_mem, window, plain; ...), and every call is
followed by ``torch.cuda.synchronize()``: a sample is the latency of one op, host enqueue plus GPU
time, and every variant is sampled under the same conditions. Reported: the median of ``--calls``
samples per variant (max over ranks) and its ratio to ``plain``.

The built-in ``nccl`` backend registers none of these buffers, so its ratios show how far two
identical paths differ by chance: the noise floor of the ``nccl_core`` ratios.

Rank 0 writes OUT/registration_latency.md and OUT/registration_latency.csv.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.distributed as dist

from . import cli
from .cases import MEMORY_OPS, OPS, VARIANTS, Env, variant_envs
from .report import human_bytes, latency_line, write_latency_reports
from .timing import alternating_latency, verify


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_backend_arguments(p, "backends to measure")
    p.add_argument(
        "--ops",
        type=cli.comma_list(MEMORY_OPS),
        default=MEMORY_OPS,
        help=f"subset of {','.join(MEMORY_OPS)} (default all)",
    )
    p.add_argument(
        "--variants",
        type=cli.comma_list(list(VARIANTS)),
        default=["plain", "nccl_mem", "window"],
        help="memory variants; plain is always measured (default plain,nccl_mem,window)",
    )
    cli.add_size_arguments(p, max_bytes="8M")
    p.add_argument("--calls", type=int, default=500, help="samples per variant (default 500)")
    cli.add_init_backend_argument(p)
    args = p.parse_args()
    cli.check_sizes(p, args)
    if args.calls < 1:
        p.error("need --calls >= 1")
    args.variants = ["plain", *[v for v in args.variants if v != "plain"]]
    args.backend_labels = args.backends
    return args


def sweep(args, envs: dict[str, Env], groups: dict[str, dist.ProcessGroup]) -> list[dict]:
    """For each op, size and backend: the variants' latencies, checked at the smallest size."""
    rows = []
    env = next(iter(envs.values()))
    for op_name in args.ops:
        op_cls = OPS[op_name]
        sizes = op_cls.sizes(args.sizes, env.world)
        for nbytes in sizes:
            cases = {variant: op_cls(nbytes, e) for variant, e in envs.items()}
            for case in cases.values():
                case.zero()  # defined contents for the sizes that are not verified
            for label, group in groups.items():
                if nbytes == sizes[0]:
                    for variant, case in cases.items():
                        what = f"{op_name} {human_bytes(nbytes)} on {label} [{variant}]"
                        fn = functools.partial(case.call, group)
                        verify(case, fn, torch.cuda.synchronize, what)
                latency = alternating_latency(cases, group, args.calls)
                row = {"op": op_name, "bytes": nbytes, "backend": label}
                row.update({f"{v}_us": s * 1e6 for v, s in latency.items()})
                rows.append(row)
                if env.rank == 0:
                    print(latency_line(row, args.variants), flush=True)
            del cases
    return rows


def main() -> None:
    args = parse_args()
    if len(set(args.backends)) != len(args.backends):
        raise SystemExit("name each backend once")
    core = cli.import_core(args.backends)
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs CUDA (memory variants are GPU memory)")
    device, _ = cli.init_distributed(args)
    groups = cli.new_groups(args)
    with variant_envs(args.variants, device, groups) as envs:
        rows = sweep(args, envs, groups)
    if dist.get_rank() == 0:
        write_latency_reports(args, device, dist.get_world_size(), core, rows)
    cli.finish()


if __name__ == "__main__":
    main()

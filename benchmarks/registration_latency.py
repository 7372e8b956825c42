"""Is any op slower on registered memory than on plain memory? One op's latency, variants in turn.

Run (one process per GPU):

    torchrun --nproc-per-node=2 benchmarks/registration_latency.py --out OUT \\
        [--backends nccl,nccl_core] [--variants plain,nccl_mem,window] [--max-bytes 8M] \\
        [--calls 500]

Below a few MiB an op costs tens of microseconds, mostly host time, and back-to-back loops of one
variant after another (collectives.py) see that host time drift by up to 30% from one loop to the
next. Here the memory variants of one (backend, op, size) take turns call by call, in a rotating
order (plain, nccl_mem, window; nccl_mem, window, plain; ...), and every call is followed by
``torch.cuda.synchronize()``: a sample is the latency of one op, host enqueue plus GPU time, and
every variant is sampled under the same conditions. Reported: the median of ``--calls`` samples
per variant (max over ranks) and its ratio to ``plain``.

The built-in ``nccl`` backend registers none of these buffers, so its ratios show how far two
identical paths differ by chance: the noise floor of the ``nccl_core`` ratios.

Rank 0 writes OUT/registration_latency.md and OUT/registration_latency.csv.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import statistics
import time

import torch
import torch.distributed as dist
from collectives import (
    OPS,
    VARIANTS,
    Env,
    comma_list,
    environment_lines,
    human_bytes,
    import_core,
    parse_bytes,
    rank_max,
    size_sweep,
    verify,
)

# Ops whose buffers a memory variant provides (put_signal's target and barrier have none).
MEMORY_OPS = [name for name in OPS if name not in ("put_signal", "barrier")]
WARMUP = 10


def alternating_latency(cases: dict, group: dist.ProcessGroup, calls: int) -> dict[str, float]:
    """Median seconds of one call + synchronize per variant, the variants taking turns."""
    names = list(cases)
    fns = {name: functools.partial(cases[name].call, group) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():
        for _ in range(WARMUP):
            fn()
    torch.cuda.synchronize()
    rank_max(0.0)  # start together
    for i in range(calls):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            torch.cuda.synchronize()
            samples[name].append(time.perf_counter() - start)
    medians = rank_max(*(statistics.median(samples[name]) for name in names))
    return dict(zip(names, medians, strict=True))


def sweep(args, envs: dict[str, Env], groups: dict) -> list[dict]:
    rows = []
    rank, world = dist.get_rank(), dist.get_world_size()
    for op_name in args.ops:
        op_cls = OPS[op_name]
        sizes = op_cls.sizes(args.sizes, world)
        for nbytes in sizes:
            cases = {variant: op_cls(nbytes, env) for variant, env in envs.items()}
            for case in cases.values():
                case.zero()  # defined contents for the sizes that are not verified
            for label, group in groups.items():
                if nbytes == sizes[0]:
                    for variant, case in cases.items():
                        what = f"{op_name} {human_bytes(nbytes)} on {label} [{variant}]"
                        verify(
                            case, functools.partial(case.call, group), torch.cuda.synchronize, what
                        )
                latency = alternating_latency(cases, group, args.calls)
                row = {"op": op_name, "bytes": nbytes, "backend": label}
                row.update({f"{v}_us": s * 1e6 for v, s in latency.items()})
                rows.append(row)
                if rank == 0:
                    ratios = "  ".join(
                        f"{v}/plain {latency[v] / latency['plain']:.3f}"
                        for v in latency
                        if v != "plain"
                    )
                    print(
                        f"{op_name:<23} {human_bytes(nbytes):>9} {label:<10} "
                        f"plain {latency['plain'] * 1e6:8.2f} us  {ratios}",
                        flush=True,
                    )
            del cases
    return rows


def report(args, rows: list[dict], head: list[str]) -> str:
    others = [v for v in args.variants if v != "plain"]
    cols = ["op", "bytes", "backend", "plain us"] + [f"{v} / plain" for v in others]
    out = [
        *head,
        f"- latency: median of {args.calls} calls + synchronize per variant, "
        "variants in turn; max over ranks",
        "",
        "## Worst ratio to plain over all sizes",
        "",
        "| op | backend | " + " | ".join(f"{v} / plain (max)" for v in others) + " |",
        "|---|---|" + "---:|" * len(others),
    ]
    for op in args.ops:
        for label in args.backend_labels:
            mine = [r for r in rows if r["op"] == op and r["backend"] == label]
            worst = [max(r[f"{v}_us"] / r["plain_us"] for r in mine) for v in others]
            out.append(f"| {op} | {label} | " + " | ".join(f"{w:.3f}" for w in worst) + " |")
    out += [
        "",
        "## Every size",
        "",
        "| " + " | ".join(cols) + " |",
        "|---|---|---|" + "---:|" * (len(cols) - 3),
    ]
    for r in rows:
        cells = [r["op"], human_bytes(r["bytes"]), r["backend"], f"{r['plain_us']:.2f}"]
        cells += [f"{r[f'{v}_us'] / r['plain_us']:.3f}" for v in others]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (written by rank 0)")
    p.add_argument(
        "--backends",
        type=comma_list(),
        default=["nccl", "nccl_core"],
        help="backends to measure (default nccl,nccl_core)",
    )
    p.add_argument(
        "--ops",
        type=comma_list(MEMORY_OPS),
        default=MEMORY_OPS,
        help=f"subset of {','.join(MEMORY_OPS)} (default all)",
    )
    p.add_argument(
        "--variants",
        type=comma_list(list(VARIANTS)),
        default=["plain", "nccl_mem", "window"],
        help="memory variants; plain is always measured (default plain,nccl_mem,window)",
    )
    p.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest size (default 8)")
    p.add_argument(
        "--max-bytes", type=parse_bytes, default=8 << 20, help="largest size (default 8M)"
    )
    p.add_argument("--step-factor", type=int, default=4, help="size multiplier (default 4)")
    p.add_argument("--calls", type=int, default=500, help="samples per variant (default 500)")
    p.add_argument(
        "--init-backend",
        default="cpu:gloo,cuda:nccl",
        help="backend of the default group (default cpu:gloo,cuda:nccl)",
    )
    args = p.parse_args()
    if args.min_bytes < 4 or args.min_bytes % 4 or args.max_bytes % 4:
        p.error("--min-bytes and --max-bytes must be positive multiples of 4")
    if args.max_bytes < args.min_bytes or args.step_factor < 2 or args.calls < 1:
        p.error("need --max-bytes >= --min-bytes, --step-factor >= 2 and --calls >= 1")
    args.variants = ["plain", *[v for v in args.variants if v != "plain"]]
    args.sizes = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    args.backend_labels = args.backends
    return args


def main() -> None:
    args = parse_args()
    if len(set(args.backends)) != len(args.backends):
        raise SystemExit("name each backend once")
    core = import_core(args.backends)
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs CUDA (memory variants are GPU memory)")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group(args.init_backend, device_id=device)
    groups = {b: dist.new_group(backend=b) for b in args.backends}
    rank, world = dist.get_rank(), dist.get_world_size()
    variants = {name: VARIANTS[name](device, groups) for name in args.variants}
    envs = {name: Env(rank, world, device, v.empty) for name, v in variants.items()}
    rows = sweep(args, envs, groups)
    for variant in variants.values():
        variant.close()
    if rank == 0:
        head = ["# Registration latency benchmark", "", *environment_lines(device, world, core)]
        text = report(args, rows, head)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "registration_latency.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "registration_latency.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(text)
    rank_max(0.0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

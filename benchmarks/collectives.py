"""Compare torch.distributed backends collective by collective.

Run from the repository root, one process per GPU:

    torchrun --nproc-per-node=2 -m benchmarks.collectives \\
        --backends nccl,nccl_core --out results/ \\
        [--ops all_reduce,send_recv] [--min-bytes 8] [--max-bytes 1G] \\
        [--step-factor 4] [--iters 200] [--warmup 5] [--target-ms 30] \\
        [--variants plain,nccl_mem,window,nccl_pool] [--repeats 2] \\
        [--modes eager,graph,overlap] [--noop-nccl]

One process group is created per backend (``dist.new_group(backend=...)``).
For every op and every size the backends are measured back to back (A, then
B, ...) on the same buffers, so they see the same conditions. Naming the same
backend twice (``--backends nccl,nccl``) measures the noise floor; ``fake`` (torch's
FakeProcessGroup, which communicates nothing) measures torch.distributed's own host
time per call. ``benchmarks.interleaved`` runs each backend in its own processes
instead and reports paired ratios with their spread.

Memory variants (--variants): ``plain`` (torch's caching allocator), ``nccl_mem``
(torch_nccl_core.empty: NCCL memory, registered by nccl_core on first use),
``window`` (torch_nccl_core.empty(window=True): a symmetric window of the
nccl_core group) and ``nccl_pool`` (the built-in backend's own MemPool,
registered with its communicator). Variants and backends of one (op, size) are
measured next to each other, ``--repeats`` times in turn, best time kept; a
variant's time against ``plain`` is the median of the ratios within each repeat.

Metrics per (variant, op, size, backend), each the max over ranks:

* time us:  wall time of N back-to-back synchronous calls (``async_op=False``)
  bracketed by ``torch.cuda.synchronize()``, divided by N. Includes host
  overhead; this is the headline number.
* host us:  median ``time.perf_counter()`` delta around a single call in that
  loop (CPU cost of enqueueing the op).
* busbw GB/s: bytes / time scaled by the nccl-tests bus factor.

``--modes graph`` also times each op captured ``--graph-calls`` times in one CUDA
graph and replayed (variant ``<variant>/graph``: time of a replay / calls).
``--modes overlap`` measures what the op costs concurrent compute (variant
``<variant>/overlap``): a bf16 matmul loop on a side stream beside back-to-back
calls; the matmul's slowdown against its loop alone, and the op's time per call
while matmuls run (each timed while the other loop covers it throughout).
``--noop-nccl`` makes nccl_core's NCCL calls enqueue nothing (the package's fake
NCCL): nccl_core's host time without NCCL's; results are then not checked.

Sizes follow nccl-tests: bytes of the per-rank buffer, except all_gather (the
full output) and reduce_scatter (the full input); dtype float32. Each (op,
backend) is checked once against known values at the smallest and a middle size
before it is timed; a wrong result aborts the run.

Rank 0 writes OUT/collectives.md, OUT/collectives.csv and
OUT/collectives_ratio.png (time of each other backend / first backend).
Without CUDA everything runs on CPU tensors (smoke test: ``--backends gloo,gloo``).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch.distributed as dist

from . import cli
from .cases import OPS, VARIANTS, Env, Op, variant_envs
from .overlap import measure_overlap
from .report import human_bytes, progress_line, write_reports
from .timing import Row, measure, measure_graph, verify

# --noop-nccl goes up to this size: the fake scripts no windows, so no copy-engine reduce-scatter.
NOOP_MAX_BYTES = 1 << 20


def add_measurement_arguments(p: argparse.ArgumentParser) -> None:
    """--iters, --warmup, --target-ms, --variants and --repeats."""
    p.add_argument(
        "--iters",
        type=int,
        default=200,
        help="max timed calls per measurement (default 200)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="untimed calls before each measurement (default 5)",
    )
    p.add_argument(
        "--target-ms",
        type=float,
        default=30.0,
        help="aim for this much time per measurement (default 30)",
    )
    p.add_argument(
        "--variants",
        type=cli.comma_list(list(VARIANTS)),
        default=["plain"],
        help=f"memory variants, comma-separated from {','.join(VARIANTS)} (default plain)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every (variant, backend) this many times in turn and keep the best "
        "(default 1)",
    )


def add_mode_arguments(p: argparse.ArgumentParser) -> None:
    """--modes and the flags of the graph and overlap modes."""
    p.add_argument(
        "--modes",
        type=cli.comma_list(["eager", "graph", "overlap"]),
        default=["eager"],
        help="eager: back-to-back calls; graph: calls captured in one CUDA graph and replayed, "
        "reported as variant '<variant>/graph'; overlap: beside a matmul loop, reported as "
        "'<variant>/overlap' with the matmul's slowdown (default eager)",
    )
    p.add_argument(
        "--matmul-size",
        type=int,
        default=8192,
        help="overlap: the matmul's square bf16 operands' side (default 8192)",
    )
    p.add_argument(
        "--overlap-ms",
        type=float,
        default=200.0,
        help="overlap: length of each timed loop (default 200)",
    )
    p.add_argument(
        "--graph-calls",
        type=int,
        default=100,
        help="calls captured in one graph (default 100)",
    )
    p.add_argument(
        "--graph-replays",
        type=int,
        default=20,
        help="timed replays of the graph (default 20)",
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_backend_arguments(p, "comma-separated backends to compare; the first is the baseline")
    p.add_argument(
        "--ops",
        type=cli.comma_list(list(OPS)),
        default=list(OPS),
        help=f"comma-separated subset of {','.join(OPS)} (default all)",
    )
    cli.add_size_arguments(p, max_bytes="1G")
    add_measurement_arguments(p)
    add_mode_arguments(p)
    cli.add_init_backend_argument(p)
    p.add_argument(
        "--noop-nccl",
        action="store_true",
        help="nccl_core's NCCL calls enqueue nothing: its host time without NCCL's "
        "(results unchecked)",
    )
    args = p.parse_args()
    cli.check_sizes(p, args)
    if args.iters < 1 or args.warmup < 0 or args.target_ms <= 0:
        p.error("need --iters >= 1, --warmup >= 0, --target-ms > 0")
    if args.repeats < 1:
        p.error("need --repeats >= 1")
    if args.noop_nccl and (
        args.variants != ["plain"] or "put_signal" in args.ops or args.max_bytes > NOOP_MAX_BYTES
    ):
        # The fake scripts collectives and send/recv only: no NCCL memory, windows or the
        # copy-engine reduce-scatter (from 32 MiB).
        p.error("--noop-nccl runs plain memory, ops other than put_signal, up to 1M bytes")
    if args.graph_calls < 1 or args.graph_replays < 1:
        p.error("need --graph-calls >= 1 and --graph-replays >= 1")
    if args.matmul_size < 1 or args.overlap_ms <= 0:
        p.error("need --matmul-size >= 1 and --overlap-ms > 0")
    args.backend_labels = cli.backend_labels(args.backends)
    # Backends whose results mean nothing: torch's floor, nccl_core over no-op NCCL calls.
    unchecked = {cli.FLOOR_BACKEND} | ({"nccl_core"} if args.noop_nccl else set())
    pairs = zip(args.backend_labels, args.backends, strict=True)
    args.checked = {label for label, backend in pairs if backend not in unchecked}
    return args


def sweep(args, envs: dict[str, Env], groups: dict[str, dist.ProcessGroup], sync) -> list[Row]:
    """For each op and size: each memory variant, each backend: check (at two sizes), then time."""
    rows = []
    env = next(iter(envs.values()))
    for op_name in args.ops:
        op_cls = OPS[op_name]
        sizes = op_cls.sizes(args.sizes, env.world)
        checked = {sizes[0], sizes[len(sizes) // 2]} if sizes else set()
        for nbytes in sizes:
            # buffers of every variant, shared by the backends at this size
            cases = {variant: op_cls(nbytes, e) for variant, e in envs.items()}
            for row in measure_size(args, cases, groups, sync, check=nbytes in checked):
                rows.append(row)
                if env.rank == 0:
                    print(progress_line(row), flush=True)
            del cases  # free buffers before the next size
    return rows


def modes(args, case: Op) -> list[str]:
    """The modes of args.modes `case` can run in (graphs need CUDA and a capturable op, overlap
    needs CUDA)."""
    cuda = case.env.device.type == "cuda"
    runs = {"eager": True, "graph": case.capturable and cuda, "overlap": cuda}
    return [m for m in args.modes if runs[m]]


def measure_size(
    args, cases: dict[str, Op], groups: dict[str, dist.ProcessGroup], sync, check: bool
) -> list[Row]:
    """One op at one size: every variant's case on every backend (checked first if `check`).

    Variants and backends are measured next to each other, `--repeats` times in turn, keeping
    each one's best time and every repeat's time (`samples_us`), so that they compare under the
    same conditions.
    """
    best: dict[tuple[str, str], Row] = {}
    samples: dict[tuple[str, str], list[float]] = {}
    slowdowns: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for variant, case in cases.items():
            for label, group in groups.items():
                fn = functools.partial(case.call, group)
                if repeat == 0 and check and label in args.checked:
                    what = f"{case.name} {human_bytes(case.nbytes)} on {label} [{variant}]"
                    verify(case, fn, sync, what)
                for mode in modes(args, case):
                    slowdown = None
                    if mode == "overlap":
                        iters, per_op, host, slowdown = measure_overlap(fn, sync, args)
                    else:
                        timer = measure_graph if mode == "graph" else measure
                        iters, per_op, host = timer(fn, sync, args)
                    setting = variant if mode == "eager" else f"{variant}/{mode}"
                    factor = case.bus_factor(case.env.world)
                    row = Row(setting, case.name, case.nbytes, label, iters, per_op * 1e6,
                              host * 1e6, factor, [], slowdown)  # fmt: skip
                    key = (setting, label)
                    samples.setdefault(key, []).append(row.time_us)
                    if slowdown is not None:
                        slowdowns.setdefault(key, []).append(slowdown)
                    if key not in best or row.time_us < best[key].time_us:
                        best[key] = row
    for key, row in best.items():
        row.samples_us = samples[key]
        if key in slowdowns:  # not the best repeat's: that would favour a fast op
            row.matmul_slowdown_pct = statistics.median(slowdowns[key])
    return list(best.values())


def main() -> None:
    args = parse_args()
    core = cli.import_core(args.backends)
    noop = cli.noop_nccl(core) if args.noop_nccl else None
    device, sync = cli.init_distributed(args)
    groups = cli.new_groups(args, noop)
    with variant_envs(args.variants, device, groups) as envs:
        rows = sweep(args, envs, groups, sync)
    if dist.get_rank() == 0:
        write_reports(args, device, dist.get_world_size(), core, rows)
    cli.finish()
    del groups, noop  # only now: nccl_core's groups were destroyed on the fake


if __name__ == "__main__":
    main()

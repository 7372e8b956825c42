"""Compare torch.distributed backends collective by collective.

Run (one process per GPU):

    torchrun --nproc-per-node=2 benchmarks/collectives.py \\
        --backends nccl,nccl_core --out results/ \\
        [--ops all_reduce,send_recv] [--min-bytes 8] [--max-bytes 1G] \\
        [--step-factor 4] [--iters 200] [--warmup 5] [--target-ms 30] \\
        [--variants plain,nccl_mem,window,nccl_pool] [--repeats 2]

One process group is created per backend (``dist.new_group(backend=...)``).
For every op and every size the backends are measured back to back (A, then
B, ...) on the same buffers, so they see the same conditions. Naming the same
backend twice (``--backends nccl,nccl``) measures the noise floor.

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
import csv
import datetime
import functools
import os
import re
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

DTYPE = torch.float32
ELEM = 4  # bytes per float32 element
PROBE_ITERS = 3  # timed calls used to choose the iteration count
MIN_ITERS = 5

# ----------------------------------------------------------------------------
# Memory variants: how benchmark buffers are allocated.
# ----------------------------------------------------------------------------


class PlainVariant:
    """Tensors from PyTorch's caching allocator, as ordinary user code gets them."""

    def __init__(self, device: torch.device, groups: dict[str, dist.ProcessGroup]):
        self.device = device

    def empty(self, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=DTYPE, device=self.device)

    def close(self) -> None:
        pass


def _group_of(groups: dict[str, dist.ProcessGroup], backend: str) -> dist.ProcessGroup:
    for group in groups.values():
        if dist.get_backend(group) == backend:
            return group
    raise SystemExit(f"this variant needs a {backend} group in --backends")


class NcclMemVariant(PlainVariant):
    """NCCL memory (torch_nccl_core.empty): nccl_core registers it on first use."""

    def empty(self, numel: int) -> torch.Tensor:
        import torch_nccl_core

        return torch_nccl_core.empty(numel, dtype=DTYPE, device=self.device)


class WindowVariant(PlainVariant):
    """NCCL memory registered as a symmetric window of the nccl_core group."""

    def __init__(self, device: torch.device, groups: dict[str, dist.ProcessGroup]):
        super().__init__(device, groups)
        self.group = _group_of(groups, "nccl_core")

    def empty(self, numel: int) -> torch.Tensor:
        import torch_nccl_core

        return torch_nccl_core.empty(
            numel, dtype=DTYPE, device=self.device, group=self.group, window=True
        )


class NcclPoolVariant(PlainVariant):
    """The built-in backend's own MemPool, registered with its communicator."""

    def __init__(self, device: torch.device, groups: dict[str, dist.ProcessGroup]):
        super().__init__(device, groups)
        self.backend = _group_of(groups, "nccl")._get_backend(device)
        self.pool = torch.cuda.MemPool(self.backend.mem_allocator)
        self.backend.register_mem_pool(self.pool)

    def empty(self, numel: int) -> torch.Tensor:
        with torch.cuda.use_mem_pool(self.pool):
            return torch.empty(numel, dtype=DTYPE, device=self.device)

    def close(self) -> None:
        self.backend.deregister_mem_pool(self.pool)
        del self.pool


# name -> class(device, groups) providing .empty(numel) and .close().
VARIANTS = {
    "plain": PlainVariant,
    "nccl_mem": NcclMemVariant,
    "window": WindowVariant,
    "nccl_pool": NcclPoolVariant,
}

# ----------------------------------------------------------------------------
# Ops: one instance = one op at one size, owning its buffers.
# ----------------------------------------------------------------------------


@dataclass
class Env:
    rank: int
    world: int
    device: torch.device
    empty: Callable[[int], torch.Tensor]


def triangle(n: int) -> int:
    """Sum of (rank + 1) over n ranks."""
    return n * (n + 1) // 2


class Op:
    """Base class. Subclasses allocate in __init__ and define call/fill/check."""

    name = ""
    split = False  # buffer is cut into world-size chunks

    def __init__(self, nbytes: int, env: Env):
        self.nbytes, self.env, self.bufs = nbytes, env, []

    @classmethod
    def sizes(cls, candidates: list[int], world: int) -> list[int]:
        """The candidate sizes this op can run at."""
        step = world * ELEM if cls.split else ELEM
        return [n for n in candidates if n % step == 0]

    @staticmethod
    def bus_factor(n: int) -> float | None:
        return 1.0

    def alloc(self, numel: int) -> torch.Tensor:
        t = self.env.empty(numel)
        self.bufs.append(t)
        return t

    @property
    def numel(self) -> int:
        return self.nbytes // ELEM

    def chunk_ids(self) -> torch.Tensor:
        """[0, 0, ..., 1, 1, ..., n-1]: the chunk index of each element."""
        ids = torch.arange(self.env.world, dtype=DTYPE, device=self.env.device)
        return ids.repeat_interleave(self.numel // self.env.world)

    def call(self, group: dist.ProcessGroup) -> None:
        raise NotImplementedError

    def fill(self) -> None:
        """Write known inputs for the correctness check."""

    def check(self) -> str | None:
        """After one call on fill()'s inputs: None if right, else what is wrong."""
        return None

    def zero(self) -> None:
        for t in self.bufs:
            t.zero_()


def mismatch(got: torch.Tensor, want: torch.Tensor | float) -> str | None:
    want = torch.as_tensor(want, dtype=got.dtype, device=got.device).expand_as(got)
    bad = (got != want).nonzero()
    if len(bad) == 0:
        return None
    i = bad[0].item()
    return (
        f"{len(bad)} of {got.numel()} elements wrong, "
        f"e.g. [{i}] = {got[i].item()} (want {want[i].item()})"
    )


class AllReduce(Op):
    name = "all_reduce"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.x = self.alloc(self.numel)

    @staticmethod
    def bus_factor(n):
        return 2 * (n - 1) / n

    def call(self, group):
        dist.all_reduce(self.x, group=group)

    def fill(self):
        self.x.fill_(self.env.rank + 1)

    def check(self):
        return mismatch(self.x, triangle(self.env.world))


class Broadcast(Op):
    name = "broadcast"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.x = self.alloc(self.numel)

    def call(self, group):
        dist.broadcast(self.x, src=0, group=group)

    def fill(self):
        self.x.fill_(self.env.rank + 1)

    def check(self):
        return mismatch(self.x, 1)


class Reduce(Op):
    name = "reduce"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.x = self.alloc(self.numel)

    def call(self, group):
        dist.reduce(self.x, dst=0, group=group)

    def fill(self):
        self.x.fill_(self.env.rank + 1)

    def check(self):
        return mismatch(self.x, triangle(self.env.world)) if self.env.rank == 0 else None


class AllGather(Op):
    name = "all_gather_into_tensor"
    split = True

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.out = self.alloc(self.numel)
        self.inp = self.alloc(self.numel // env.world)

    @staticmethod
    def bus_factor(n):
        return (n - 1) / n

    def call(self, group):
        dist.all_gather_into_tensor(self.out, self.inp, group=group)

    def fill(self):
        self.inp.fill_(self.env.rank + 1)
        self.out.fill_(-1)

    def check(self):
        return mismatch(self.out, self.chunk_ids() + 1)


class ReduceScatter(Op):
    name = "reduce_scatter_tensor"
    split = True

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.inp = self.alloc(self.numel)
        self.out = self.alloc(self.numel // env.world)

    @staticmethod
    def bus_factor(n):
        return (n - 1) / n

    def call(self, group):
        dist.reduce_scatter_tensor(self.out, self.inp, group=group)

    def fill(self):
        self.inp.copy_((self.chunk_ids() + 1) * (self.env.rank + 1))
        self.out.fill_(-1)

    def check(self):
        rank, world = self.env.rank, self.env.world
        return mismatch(self.out, (rank + 1) * triangle(world))


class AllToAll(Op):
    name = "all_to_all_single"
    split = True

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.inp = self.alloc(self.numel)
        self.out = self.alloc(self.numel)

    @staticmethod
    def bus_factor(n):
        return (n - 1) / n

    def call(self, group):
        dist.all_to_all_single(self.out, self.inp, group=group)

    def fill(self):
        # chunk j of rank r's input carries r * world + j
        self.inp.copy_(self.env.rank * self.env.world + self.chunk_ids())
        self.out.fill_(-1)

    def check(self):
        return mismatch(self.out, self.chunk_ids() * self.env.world + self.env.rank)


class SendRecv(Op):
    """Ring exchange: send to rank + 1, receive from rank - 1, one batch."""

    name = "send_recv"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.send = self.alloc(self.numel)
        self.recv = self.alloc(self.numel)
        self.next = (env.rank + 1) % env.world
        self.prev = (env.rank - 1) % env.world

    @classmethod
    def sizes(cls, candidates, world):
        return super().sizes(candidates, world) if world > 1 else []

    def call(self, group):
        ops = [
            dist.P2POp(dist.isend, self.send, self.next, group),
            dist.P2POp(dist.irecv, self.recv, self.prev, group),
        ]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    def fill(self):
        self.send.fill_(self.env.rank + 1)
        self.recv.fill_(-1)

    def check(self):
        return mismatch(self.recv, self.prev + 1)


class PutSignal(SendRecv):
    """Ring put: put_signal into rank + 1's window, wait for rank - 1's signal (nccl_core).

    Other backends run the send/recv ring of the same size: the operation it replaces.
    """

    name = "put_signal"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.plain_recv = self.recv
        self.windows: dict[str, tuple] = {}

    def _window(self, group):
        # Registered on the first call, which every rank makes together.
        if group.group_name not in self.windows:
            import torch_nccl_core

            memory = torch_nccl_core.empty(self.numel, dtype=DTYPE, group=group, window=True)
            comm = torch_nccl_core.communicator(group)
            self.windows[group.group_name] = (comm, memory, comm.find_window(memory))
        return self.windows[group.group_name]

    def call(self, group):
        if dist.get_backend(group) != "nccl_core":
            self.recv = self.plain_recv
            return super().call(group)
        import torch_nccl_core

        comm, memory, window = self._window(group)
        comm.put_signal(self.send, self.next, window)
        comm.wait_signal(torch_nccl_core.WaitSignalDesc(self.prev))
        self.recv = memory

    def fill(self):
        self.send.fill_(self.env.rank + 1)
        for _, memory, _ in self.windows.values():
            memory.fill_(-1)
        self.plain_recv.fill_(-1)


class Barrier(Op):
    name = "barrier"

    @classmethod
    def sizes(cls, candidates, world):
        return [0]

    @staticmethod
    def bus_factor(n):
        return None

    def call(self, group):
        dist.barrier(group=group)


OPS = {
    cls.name: cls
    for cls in (
        AllReduce,
        Broadcast,
        Reduce,
        AllGather,
        ReduceScatter,
        AllToAll,
        SendRecv,
        PutSignal,
        Barrier,
    )
}

# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------


def rank_max(*values: float) -> list[float]:
    """Element-wise max over all ranks (CPU tensor on the default group). Also a barrier."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def timed_loop(fn: Callable[[], None], iters: int, sync: Callable[[], None]) -> tuple[float, float]:
    """Call fn iters times back to back; return (wall s per call, median host s per call)."""
    host = [0.0] * iters
    sync()
    start = time.perf_counter()
    for i in range(iters):
        t = time.perf_counter()
        fn()
        host[i] = time.perf_counter() - t
    sync()
    return (time.perf_counter() - start) / iters, statistics.median(host)


def measure(fn: Callable[[], None], sync: Callable[[], None], args) -> tuple[int, float, float]:
    """Warm up, pick an iteration count for ~target_ms, time. Returns (iters, s/op, host s/op)."""
    for _ in range(args.warmup):
        fn()
    probe, _ = timed_loop(fn, PROBE_ITERS, sync)
    (probe,) = rank_max(probe)  # every rank must run the same number of calls
    wanted = round(args.target_ms / 1e3 / max(probe, 1e-9))
    iters = min(args.iters, max(MIN_ITERS, wanted))
    rank_max(0.0)  # start the timed loop together
    per_op, host = timed_loop(fn, iters, sync)
    per_op, host = rank_max(per_op, host)
    return iters, per_op, host


def verify(case: Op, fn: Callable[[], None], sync: Callable[[], None], what: str) -> None:
    """Run fn once on known inputs; abort every rank if any rank got a wrong result."""
    case.fill()
    fn()
    sync()
    err = case.check()
    (failed,) = rank_max(float(err is not None))
    case.zero()  # time on zeros: repeated reductions cannot overflow
    if failed:
        where = f"rank {case.env.rank}: {err}" if err else "another rank (see its message)"
        raise SystemExit(f"CORRECTNESS CHECK FAILED: {what}, {where}")


@dataclass
class Row:
    variant: str
    op: str
    nbytes: int
    backend: str
    iters: int
    time_us: float
    host_us: float
    factor: float | None  # nccl-tests bus factor; None: no bandwidth (barrier)
    samples_us: list[float]  # time of each repeat, in measurement order; time_us is the least

    @property
    def algbw(self) -> float | None:
        """GB/s"""
        return None if self.factor is None else self.nbytes / self.time_us / 1e3

    @property
    def busbw(self) -> float | None:
        """GB/s"""
        return None if self.factor is None else self.algbw * self.factor


def sweep(args, envs: dict[str, Env], groups: dict, sync) -> list[Row]:
    """For each op and size: each memory variant, each backend: check (at two sizes), then time.

    Variants and backends of one (op, size) are measured next to each other, `--repeats` times
    in turn, keeping each one's best time and every repeat's time (`samples_us`), so that they
    compare under the same conditions.
    """
    rows = []
    rank, world = next(iter(envs.values())).rank, next(iter(envs.values())).world
    for op_name in args.ops:
        op_cls = OPS[op_name]
        factor = op_cls.bus_factor(world)
        sizes = op_cls.sizes(args.sizes, world)
        checked = {sizes[0], sizes[len(sizes) // 2]} if sizes else set()
        for nbytes in sizes:
            # buffers of every variant, shared by the backends at this size
            cases = {variant: op_cls(nbytes, env) for variant, env in envs.items()}
            best: dict[tuple[str, str], Row] = {}
            samples: dict[tuple[str, str], list[float]] = {}
            for repeat in range(args.repeats):
                for variant, case in cases.items():
                    for label, group in groups.items():
                        fn = functools.partial(case.call, group)
                        if repeat == 0 and nbytes in checked:
                            what = f"{op_name} {human_bytes(nbytes)} on {label} [{variant}]"
                            verify(case, fn, sync, what)
                        iters, per_op, host = measure(fn, sync, args)
                        row = Row(variant, op_name, nbytes, label, iters, per_op * 1e6,
                                  host * 1e6, factor, [])  # fmt: skip
                        key = (variant, label)
                        samples.setdefault(key, []).append(row.time_us)
                        if key not in best or row.time_us < best[key].time_us:
                            best[key] = row
            for key, row in best.items():
                row.samples_us = samples[key]
                rows.append(row)
                if rank == 0:
                    print(progress_line(row), flush=True)
            del cases, case, fn  # free buffers before the next size
    return rows


# ----------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------


def human_bytes(n: int) -> str:
    if n == 0:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


def fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


def progress_line(r: Row) -> str:
    return (
        f"{r.variant:<6} {r.op:<23} {human_bytes(r.nbytes):>9} {r.backend:<10} "
        f"iters {r.iters:4d}  time {r.time_us:11.2f} us  host {r.host_us:8.2f} us  "
        f"busbw {fmt(r.busbw, '8.2f') or '-':>8} GB/s"
    )


def paired_ratio(base: Row, other: Row) -> float:
    """Median over repeats of other's time / base's time in the same repeat.

    The two were measured next to each other in every repeat, so each pair shares the conditions
    of its moment (host load, clocks) and drift between repeats cancels out of the ratio.
    """
    pairs = zip(base.samples_us, other.samples_us, strict=True)
    return statistics.median(o / b for b, o in pairs)


def pivot(rows: list[Row]) -> dict[tuple[str, str, int], dict[str, Row]]:
    """(variant, op, bytes) -> {backend: Row}, in measurement order."""
    table: dict[tuple[str, str, int], dict[str, Row]] = {}
    for r in rows:
        table.setdefault((r.variant, r.op, r.nbytes), {})[r.backend] = r
    return table


def version_str(v) -> str:
    return ".".join(str(x) for x in v) if isinstance(v, tuple | list) else str(v)


def environment_lines(device: torch.device, world: int, core) -> list[str]:
    """Where a run was made: date, host, versions, device."""
    try:
        nccl_torch = version_str(torch.cuda.nccl.version())
    except (RuntimeError, AttributeError):  # CPU-only build
        nccl_torch = "n/a"
    nccl_core = version_str(core.nccl_version()) if core else "n/a (not imported)"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    now = datetime.datetime.now().isoformat(timespec="seconds")
    return [
        f"- date: {now}, host {socket.gethostname()}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}",
        f"- NCCL: torch {nccl_torch}, torch_nccl_core {nccl_core}",
        f"- device: {gpu}, world size {world}",
    ]


def header_lines(args, device: torch.device, world: int, core) -> list[str]:
    return [
        "# Collective benchmark",
        "",
        *environment_lines(device, world, core),
        (f"- backends: {', '.join(args.backend_labels)}; default group: {args.init_backend}"),
        (
            f"- float32; per measurement: {args.warmup} warmup calls, then "
            f"{MIN_ITERS}..{args.iters} timed calls (~{args.target_ms:g} ms)"
        ),
        (
            "- time: wall time of back-to-back synchronous calls / calls; "
            "host: median CPU time of one call; busbw: nccl-tests bus bandwidth; "
            "all max over ranks"
        ),
        ("- bytes: per-rank buffer (all_gather: full output, reduce_scatter: full input)"),
    ]


def markdown(rows: list[Row], labels: list[str], head: list[str]) -> str:
    base, others = labels[0], labels[1:]
    cols = ["op", "bytes"]
    for label in labels:
        cols += [f"{label} time us", f"{label} host us", f"{label} busbw GB/s"]
    for o in others:
        cols += [f"time {o}/{base}", f"busbw {o}/{base}"]
    out = list(head)
    table = pivot(rows)
    for variant in dict.fromkeys(r.variant for r in rows):
        out += ["", f"## variant `{variant}`", ""]
        out += ["| " + " | ".join(cols) + " |", "|---|---|" + "---:|" * (len(cols) - 2)]
        for (v, op, nbytes), by in table.items():
            if v != variant:
                continue
            cells = [op, human_bytes(nbytes)]
            for label in labels:
                r = by[label]
                cells += [
                    fmt(r.time_us, ".2f"),
                    fmt(r.host_us, ".2f"),
                    fmt(r.busbw, ".2f"),
                ]
            for o in others:
                cells += [
                    fmt(ratio(by[base].time_us, by[o].time_us), ".3f"),
                    fmt(ratio(by[base].busbw, by[o].busbw), ".3f"),
                ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out + memory_table(rows, labels)) + "\n"


def memory_table(rows: list[Row], labels: list[str]) -> list[str]:
    """Each backend's other memory variants against its own `plain` run, and bus bandwidth
    against the baseline backend on plain memory."""
    variants = [v for v in dict.fromkeys(r.variant for r in rows) if v != "plain"]
    if not variants or not any(r.variant == "plain" for r in rows):
        return []
    base = labels[0]
    table = pivot(rows)
    cols = ["op", "bytes", "backend", "plain time us"]
    for v in variants:
        cols += [f"{v} time / plain", f"{v} busbw / {base} plain"]
    out = ["", "## memory variants against plain memory", ""]
    out += [
        "time ratios below 1 mean the variant is faster than the same backend on plain memory",
        "(median over the repeats of the ratio within each repeat, where the two ran next to",
        f"each other); bandwidth ratios (best times) compare with {base} on plain memory.",
        "",
        "| " + " | ".join(cols) + " |",
        "|---|---|---|" + "---:|" * (len(cols) - 3),
    ]
    for (variant, op, nbytes), by in table.items():
        if variant != "plain":
            continue
        for label in labels:
            plain = by[label]
            cells = [op, human_bytes(nbytes), label, fmt(plain.time_us, ".2f")]
            for v in variants:
                other = table.get((v, op, nbytes), {}).get(label)
                cells += [
                    fmt(paired_ratio(plain, other) if other else None, ".3f"),
                    fmt(ratio(by[base].busbw, other.busbw) if other else None, ".3f"),
                ]
            out.append("| " + " | ".join(cells) + " |")
    return out


def write_csv(path: str, rows: list[Row]) -> None:
    head = "variant op bytes backend iters time_us host_us algbw_gbs busbw_gbs"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head.split())
        for r in rows:
            values = (r.time_us, r.host_us, r.algbw, r.busbw)
            nums = [fmt(v, ".3f") for v in values]
            w.writerow([r.variant, r.op, r.nbytes, r.backend, r.iters, *nums])


def write_plot(path: str, rows: list[Row], labels: list[str]) -> None:
    """One line per op (and variant/backend if several): time ratio vs the first backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot written")
        return
    base, others = labels[0], labels[1:]
    variants = list(dict.fromkeys(r.variant for r in rows))
    series: dict[str, tuple[list[int], list[float]]] = {}
    for (variant, op, nbytes), by in pivot(rows).items():
        for o in others:
            if nbytes == 0:  # barrier: no size axis
                continue
            name = " ".join(
                [op]
                + ([f"[{variant}]"] if len(variants) > 1 else [])
                + ([o] if len(others) > 1 else [])
            )
            xs, ys = series.setdefault(name, ([], []))
            xs.append(nbytes)
            ys.append(by[o].time_us / by[base].time_us)
    fig, ax = plt.subplots(figsize=(10, 6))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(0.5, color="gray", linewidth=1, linestyle="--")
    ax.set_xscale("log", base=2)
    ticks = sorted({x for xs, _ in series.values() for x in xs})
    ax.set_xticks(ticks, [human_bytes(t) for t in ticks], rotation=45, ha="right")
    ax.set_xlabel("bytes")
    ax.set_ylabel(f"time {' | '.join(others)} / {base}  (lower: faster than {base})")
    ax.set_title(f"{' | '.join(others)} vs {base}: time per op ratio")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(args, device: torch.device, world: int, core, rows: list[Row]) -> None:
    os.makedirs(args.out, exist_ok=True)
    text = markdown(rows, args.backend_labels, header_lines(args, device, world, core))
    with open(os.path.join(args.out, "collectives.md"), "w") as f:
        f.write(text)
    write_csv(os.path.join(args.out, "collectives.csv"), rows)
    if len(args.backend_labels) > 1:
        write_plot(os.path.join(args.out, "collectives_ratio.png"), rows, args.backend_labels)
    print(text)
    print(
        f"wrote {args.out}/collectives.{{md,csv}}"
        + (" and collectives_ratio.png" if len(args.backend_labels) > 1 else "")
    )


# ----------------------------------------------------------------------------
# CLI and setup
# ----------------------------------------------------------------------------

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(I?B)?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 8, 64K, 1M, 1G)")
    return int(m[1]) * _UNITS[m[2]]


def comma_list(choices: list[str] | None = None) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        unknown = [s for s in items if choices is not None and s not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown)} (choose from {', '.join(choices)})"
            )
        return items

    return parse


def size_sweep(lo: int, hi: int, factor: int) -> list[int]:
    """lo, lo*factor, ... up to hi; hi itself is always included."""
    sizes = []
    n = lo
    while n < hi:
        sizes.append(n)
        n *= factor
    return [*sizes, hi]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--backends",
        type=comma_list(),
        default=["nccl", "nccl_core"],
        help="comma-separated backends to compare; the first is the baseline "
        "(default nccl,nccl_core)",
    )
    p.add_argument("--out", required=True, help="output directory (written by rank 0)")
    p.add_argument(
        "--ops",
        type=comma_list(list(OPS)),
        default=list(OPS),
        help=f"comma-separated subset of {','.join(OPS)} (default all)",
    )
    p.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest size (default 8)")
    p.add_argument(
        "--max-bytes",
        type=parse_bytes,
        default=1 << 30,
        help="largest size (default 1G)",
    )
    p.add_argument(
        "--step-factor",
        type=int,
        default=4,
        help="size multiplier between steps (default 4)",
    )
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
        type=comma_list(list(VARIANTS)),
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
    p.add_argument(
        "--init-backend",
        default="cpu:gloo,cuda:nccl",
        help="backend of the default process group (default cpu:gloo,cuda:nccl)",
    )
    args = p.parse_args()
    if args.min_bytes < ELEM or args.min_bytes % ELEM or args.max_bytes % ELEM:
        p.error(f"--min-bytes and --max-bytes must be positive multiples of {ELEM}")
    if args.max_bytes < args.min_bytes:
        p.error("--max-bytes is smaller than --min-bytes")
    if args.step_factor < 2 or args.iters < 1 or args.warmup < 0 or args.target_ms <= 0:
        p.error("need --step-factor >= 2, --iters >= 1, --warmup >= 0, --target-ms > 0")
    if args.repeats < 1:
        p.error("need --repeats >= 1")
    args.sizes = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    # distinct labels, so that "nccl,nccl" (noise floor) works
    counts = {b: args.backends.count(b) for b in args.backends}
    args.backend_labels = [
        b if counts[b] == 1 else f"{b}#{i + 1}" for i, b in enumerate(args.backends)
    ]
    return args


def import_core(backends: list[str]):
    """Import torch_nccl_core (registers the "nccl_core" backend); None if absent and unneeded."""
    try:
        import torch_nccl_core
    except ImportError as e:
        if "nccl_core" in backends:
            raise SystemExit(
                f"--backends names nccl_core but torch_nccl_core cannot be imported: {e}"
            ) from e
        return None
    return torch_nccl_core


def init_distributed(args) -> tuple[torch.device, Callable[[], None]]:
    """Initialise the default group; return this rank's device and its synchronize()."""
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu"), lambda: None
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    bind = {} if args.init_backend == "gloo" else {"device_id": device}
    dist.init_process_group(args.init_backend, **bind)
    return device, torch.cuda.synchronize


def main() -> None:
    args = parse_args()
    core = import_core(args.backends)
    device, sync = init_distributed(args)
    groups = {
        label: dist.new_group(backend=b)
        for label, b in zip(args.backend_labels, args.backends, strict=False)
    }
    rank, world = dist.get_rank(), dist.get_world_size()
    variants = {name: VARIANTS[name](device, groups) for name in args.variants}
    envs = {name: Env(rank, world, device, v.empty) for name, v in variants.items()}
    rows = sweep(args, envs, groups, sync)
    for variant in variants.values():
        variant.close()
    if rank == 0:
        write_reports(args, device, world, core, rows)
    rank_max(0.0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""How the benchmarks time and check ops: timed loops, latency samples, correctness checks, all
agreed over the ranks; and the result rows they produce.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .cases import Op

PROBE_ITERS = 3  # timed calls used to choose the iteration count
MIN_ITERS = 5
LATENCY_WARMUP = 10  # untimed calls of each variant before alternating_latency samples


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


def measure_graph(
    fn: Callable[[], None], sync: Callable[[], None], args
) -> tuple[int, float, float]:
    """Capture args.graph_calls calls of fn in one CUDA graph (after args.warmup eager calls) and
    replay it args.graph_replays times. Returns (calls, s/op, host s/op of launching replays)."""
    for _ in range(args.warmup):
        fn()
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(args.graph_calls):
            fn()
    graph.replay()  # the first replay uploads the graph
    sync()
    rank_max(0.0)  # start the timed replays together
    per_replay, host = timed_loop(graph.replay, args.graph_replays, sync)
    per_replay, host = rank_max(per_replay, host)
    del graph
    return args.graph_calls, per_replay / args.graph_calls, host / args.graph_calls


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
    """One (variant, op, size, backend) of a sweep: its best repeat; times are max over ranks."""

    variant: str
    op: str
    nbytes: int
    backend: str
    iters: int
    time_us: float
    host_us: float
    factor: float | None  # nccl-tests bus factor; None: no bandwidth (barrier)
    samples_us: list[float]  # time of each repeat, in measurement order; time_us is the least
    # Mode overlap: how much slower a concurrent matmul ran (measure_overlap).
    matmul_slowdown_pct: float | None = None

    @property
    def algbw(self) -> float | None:
        """GB/s"""
        return None if self.factor is None else self.nbytes / self.time_us / 1e3

    @property
    def busbw(self) -> float | None:
        """GB/s"""
        return None if self.factor is None else self.algbw * self.factor


def paired_ratio(base: Row, other: Row) -> float:
    """Median over repeats of other's time / base's time in the same repeat.

    The two were measured next to each other in every repeat, so each pair shares the conditions
    of its moment (host load, clocks) and drift between repeats cancels out of the ratio.
    """
    pairs = zip(base.samples_us, other.samples_us, strict=True)
    return statistics.median(o / b for b, o in pairs)


def alternating_latency(
    cases: dict[str, Op], group: dist.ProcessGroup, calls: int
) -> dict[str, float]:
    """Median seconds of one call + synchronize per variant, the variants taking turns."""
    names = list(cases)
    fns = {name: functools.partial(cases[name].call, group) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():
        for _ in range(LATENCY_WARMUP):
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

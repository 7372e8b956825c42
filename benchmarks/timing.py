"""How the benchmarks time and check ops: timed loops, latency samples, correctness checks, all
agreed over the ranks; and the result rows they produce.
"""

from __future__ import annotations

import collections
import functools
import math
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


OVERLAP_COVER = 1.25  # the loop that is not timed outlasts the timed one by this factor
OVERLAP_LEAD = 4  # matmuls kept queued on the side stream, however slow the calls' host
OVERLAP_TRIES = 3  # doublings of the covering loop before coverage is given up


def _stream_seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
    return start.elapsed_time(end) / 1e3


def measure_overlap(
    fn: Callable[[], None], sync: Callable[[], None], args
) -> tuple[int, float, float, float]:
    """The SM cost of fn: a bf16 matmul loop (args.matmul_size squared) on a side stream beside
    back-to-back calls of fn on the current one. Two runs, each timing one loop while the other
    covers it throughout (checked on the GPU's clock, the covering loop doubled until it does):
    the matmul loop under fn's calls against the matmul loop alone (the mean of one run before
    and one after, after a run that settles the clocks), and fn's calls under matmuls. Returns
    (calls, s/op of fn under matmuls, host s/op, matmul slowdown in percent); every rank runs the
    same counts, times are max over ranks."""
    n = args.matmul_size
    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    c = torch.empty_like(a)
    side = torch.cuda.Stream()

    def run(matmuls: int, calls: int) -> tuple[float, float, float, float]:
        """Both loops from one start. The matmuls are kept OVERLAP_LEAD ahead of the side stream
        (by its events, not the host's clock), so that host-bound calls never leave it idle, and
        all go at once when the calls are done. Returns (matmul loop s, fn s/op, median host s
        per call, s by which the matmul loop ended after the calls)."""
        sync()
        rank_max(0.0)  # start together
        start, end, mm_start, mm_end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        start.record()
        side.wait_event(start)
        mm_start.record(side)
        queued: collections.deque = collections.deque()
        host, done_mm, done_calls = [], 0, 0
        while done_mm < matmuls or done_calls < calls:
            while queued and queued[0].query():
                queued.popleft()
            if done_mm < matmuls and (done_calls >= calls or len(queued) < OVERLAP_LEAD):
                with torch.cuda.stream(side):
                    torch.mm(a, b, out=c)
                queued.append(torch.cuda.Event())
                queued[-1].record(side)
                done_mm += 1
            else:
                t = time.perf_counter()
                fn()
                host.append(time.perf_counter() - t)
                done_calls += 1
        end.record()
        mm_end.record(side)
        sync()
        per_call = _stream_seconds(start, end) / calls if calls else 0.0
        median_host = statistics.median(host) if host else 0.0
        return (
            _stream_seconds(mm_start, mm_end),
            per_call,
            median_host,
            _stream_seconds(end, mm_end),
        )

    def covered(matmuls: int, calls: int, timed: str) -> tuple[float, float, float, float]:
        """run() until the loop that is not `timed` ("matmuls" or "calls") outlasts the other
        on every rank, doubling it each time (every rank doubles together)."""
        for _ in range(OVERLAP_TRIES):
            result = run(matmuls, calls)
            ok = result[3] <= 0 if timed == "matmuls" else result[3] >= 0
            (short,) = rank_max(0.0 if ok else 1.0)
            if not short:
                return result
            if timed == "matmuls":
                calls *= 2
            else:
                matmuls *= 2
        raise SystemExit(f"overlap: the loop covering the {timed} never outlasted them")

    for _ in range(args.warmup):
        run(1, 0)
    mm_probe = run(PROBE_ITERS, 0)[0]
    (mm_probe,) = rank_max(mm_probe / PROBE_ITERS)
    # A full timed loop, not a few synchronized calls: the covering loop's count comes from it.
    _, call_probe, _ = measure(fn, sync, args)
    call_probe = max(call_probe, 1e-9)
    matmuls = max(MIN_ITERS, round(args.overlap_ms / 1e3 / mm_probe))
    calls = max(MIN_ITERS, round(args.overlap_ms / 1e3 / call_probe))
    run(matmuls, 0)  # the clocks settle under a full loop first
    (before,) = rank_max(run(matmuls, 0)[0])  # the counts below must agree over the ranks
    loaded = covered(matmuls, math.ceil(OVERLAP_COVER * before / call_probe), "matmuls")[0]
    after = run(matmuls, 0)[0]  # alone again: drift between the runs averages out
    cover = math.ceil(OVERLAP_COVER * calls * call_probe / mm_probe)
    _, per_call, host, _ = covered(cover, calls, "calls")
    loaded, after, per_call, host = rank_max(loaded, after, per_call, host)
    return calls, per_call, host, (2 * loaded / (before + after) - 1) * 100


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

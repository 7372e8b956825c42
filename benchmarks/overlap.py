"""The SM cost of an op (``benchmarks.collectives --modes overlap``): how much slower a bf16 matmul
loop on a side stream runs beside back-to-back calls of the op, and the op's time per call while
matmuls run. Each is timed while the other loop covers it throughout, checked on the GPU's clock.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from collections.abc import Callable

import torch

from .timing import MIN_ITERS, PROBE_ITERS, measure, rank_max

COVER = 1.25  # the loop that is not timed outlasts the timed one by this factor
LEAD = 4  # matmuls kept queued on the side stream, however slow the calls' host
TRIES = 3  # runs, the covering loop doubled after each, before coverage is given up


def _seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
    return start.elapsed_time(end) / 1e3


class MatmulBeside:
    """A loop of `n` x `n` bf16 matmuls on a side stream beside calls of `fn` on the current one."""

    def __init__(self, fn: Callable[[], None], sync: Callable[[], None], n: int):
        self.fn, self.sync = fn, sync
        self.a, self.b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        self.c = torch.empty_like(self.a)
        self.side = torch.cuda.Stream()

    def _matmul(self, queued: collections.deque) -> None:
        with torch.cuda.stream(self.side):
            torch.mm(self.a, self.b, out=self.c)
        queued.append(torch.cuda.Event())
        queued[-1].record(self.side)

    def run(self, matmuls: int, calls: int) -> tuple[float, float, float, float]:
        """Both loops from one start. The matmuls are kept LEAD ahead of the side stream (by its
        events, not the host's clock), so that host-bound calls never leave it idle, and all go
        at once when the calls are done. Returns (matmul loop s, s per call, median host s per
        call, s by which the matmul loop ended after the calls)."""
        self.sync()
        rank_max(0.0)  # start together
        start, end, mm_start, mm_end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        start.record()
        self.side.wait_event(start)
        mm_start.record(self.side)
        queued: collections.deque = collections.deque()
        host, done_mm, done_calls = [], 0, 0
        while done_mm < matmuls or done_calls < calls:
            while queued and queued[0].query():
                queued.popleft()
            if done_mm < matmuls and (done_calls >= calls or len(queued) < LEAD):
                self._matmul(queued)
                done_mm += 1
            else:
                t = time.perf_counter()
                self.fn()
                host.append(time.perf_counter() - t)
                done_calls += 1
        end.record()
        mm_end.record(self.side)
        self.sync()
        per_call = _seconds(start, end) / calls if calls else 0.0
        median_host = statistics.median(host) if host else 0.0
        return _seconds(mm_start, mm_end), per_call, median_host, _seconds(end, mm_end)

    def covered(self, matmuls: int, calls: int, timed: str) -> tuple[float, float, float, float]:
        """run() until the loop that is not `timed` ("matmuls" or "calls") outlasts the other on
        every rank, doubling it each time (every rank doubles together)."""
        for _ in range(TRIES):
            result = self.run(matmuls, calls)
            ok = result[3] <= 0 if timed == "matmuls" else result[3] >= 0
            (short,) = rank_max(0.0 if ok else 1.0)
            if not short:
                return result
            if timed == "matmuls":
                calls *= 2
            else:
                matmuls *= 2
        raise SystemExit(f"overlap: the loop covering the {timed} never outlasted them")


def measure_overlap(
    fn: Callable[[], None], sync: Callable[[], None], args
) -> tuple[int, float, float, float]:
    """Returns (calls, s per call of fn under matmuls, host s per call, matmul slowdown in
    percent): the matmul loop under fn's calls against the loop alone (the mean of one run before
    and one after, after a run that settles the clocks). Every rank runs the same counts; times
    are max over ranks."""
    loops = MatmulBeside(fn, sync, args.matmul_size)
    for _ in range(args.warmup):
        loops.run(1, 0)
    (mm_probe,) = rank_max(loops.run(PROBE_ITERS, 0)[0] / PROBE_ITERS)
    # A full timed loop, not a few synchronized calls: the covering loop's count comes from it.
    call_probe = max(measure(fn, sync, args)[1], 1e-9)
    matmuls = max(MIN_ITERS, round(args.overlap_ms / 1e3 / mm_probe))
    calls = max(MIN_ITERS, round(args.overlap_ms / 1e3 / call_probe))
    loops.run(matmuls, 0)  # the clocks settle under a full loop first
    (before,) = rank_max(loops.run(matmuls, 0)[0])  # the counts below must agree over the ranks
    loaded = loops.covered(matmuls, math.ceil(COVER * before / call_probe), "matmuls")[0]
    after = loops.run(matmuls, 0)[0]  # alone again: drift between the runs averages out
    cover = math.ceil(COVER * calls * call_probe / mm_probe)
    _, per_call, host, _ = loops.covered(cover, calls, "calls")
    loaded, after, per_call, host = rank_max(loaded, after, per_call, host)
    return calls, per_call, host, (2 * loaded / (before + after) - 1) * 100

"""The SM cost of an op (``benchmarks.collectives --modes overlap``): how much slower a bf16 matmul
loop on a side stream runs beside back-to-back calls of the op, and the op's time per call while
matmuls run. Each is timed while the other loop covers it throughout, by construction: the
covering loop goes on until the GPU has finished the timed one.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from .timing import MIN_ITERS, PROBE_ITERS, measure, rank_max

LEAD = 4  # matmuls kept queued on the side stream, however slow the calls' host
CHUNK = 4  # calls between two looks at the GPU's progress
AHEAD = 4  # chunks of calls the host may be ahead of the GPU: it never blocks inside a call


def _seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
    return start.elapsed_time(end) / 1e3


def _timing_events(count: int) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(count)]


class Agreement:
    """Whether every rank is done, agreed without blocking on the slowest: each round starts an
    all-reduce of this rank's state over the CPU group and reads the previous round's, so every
    rank answers True in the same round (the one after the last rank got done)."""

    def __init__(self):
        self.previous: tuple[dist.Work, torch.Tensor] | None = None

    def all_done(self, done: bool) -> bool:
        busy = torch.tensor([0.0 if done else 1.0], dtype=torch.float64)
        work = dist.all_reduce(busy, op=dist.ReduceOp.MAX, async_op=True)
        previous, self.previous = self.previous, (work, busy)
        if previous is None:
            return False
        previous[0].wait()
        if previous[1].item() != 0.0:
            return False
        work.wait()  # every started all-reduce ends here
        self.previous = None
        return True


class MatmulBeside:
    """A loop of `n` x `n` bf16 matmuls on a side stream beside calls of `fn` on the current one.

    Neither loop may leave the GPU idle while the other is timed: the host keeps LEAD matmuls
    queued and stays at most AHEAD chunks of calls ahead (waiting on events, not inside a call),
    topping the matmuls up while it waits.
    """

    def __init__(self, fn: Callable[[], None], sync: Callable[[], None], n: int):
        self.fn, self.sync = fn, sync
        self.a, self.b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        self.c = torch.empty_like(self.a)
        self.side = torch.cuda.Stream()
        self.matmuls: collections.deque = collections.deque()  # pending matmuls' events
        self.chunks: collections.deque = collections.deque()  # pending chunks' events
        self.left = 0.0  # matmuls still to queue (math.inf: until told to stop)
        self.last: torch.cuda.Event | None = None  # recorded after the last of them

    def _settle(self) -> None:
        self.sync()
        self.matmuls.clear()
        self.chunks.clear()

    def _top_up(self) -> None:
        while self.matmuls and self.matmuls[0].query():
            self.matmuls.popleft()
        while self.left > 0 and len(self.matmuls) < LEAD:
            with torch.cuda.stream(self.side):
                torch.mm(self.a, self.b, out=self.c)
            self.matmuls.append(torch.cuda.Event())
            self.matmuls[-1].record(self.side)
            self.left -= 1
            if self.left == 0 and self.last is not None:
                self.last.record(self.side)

    def _chunk(self, calls: int, host: list[float]) -> None:
        while len(self.chunks) >= AHEAD:
            if self.chunks[0].query():
                self.chunks.popleft()
            self._top_up()
        for _ in range(calls):
            self._top_up()
            t = time.perf_counter()
            self.fn()
            host.append(time.perf_counter() - t)
        self.chunks.append(torch.cuda.Event())
        self.chunks[-1].record()

    def alone(self, matmuls: int) -> float:
        """Seconds of `matmuls` matmuls with nothing beside them."""
        self._settle()
        start, end = _timing_events(2)
        start.record(self.side)
        with torch.cuda.stream(self.side):
            for _ in range(matmuls):
                torch.mm(self.a, self.b, out=self.c)
        end.record(self.side)
        self._settle()
        return _seconds(start, end)

    def under_calls(self, matmuls: int) -> float:
        """Seconds of `matmuls` matmuls with calls beside them until every rank's matmuls are
        done (agreed without pausing the calls, so every rank makes the same calls)."""
        assert matmuls > 0
        self._settle()
        rank_max(0.0)  # start together
        start, self.last = _timing_events(2)
        start.record(self.side)
        self.left = matmuls
        agreement = Agreement()
        while True:
            self._chunk(CHUNK, [])
            if agreement.all_done(self.left == 0 and self.last.query()):
                break
        self._settle()
        return _seconds(start, self.last)

    def calls_under(self, calls: int) -> tuple[float, float]:
        """`calls` calls with matmuls beside them from before the first until the GPU has done
        the last. Returns (s per call, median host s per call)."""
        assert calls > 0
        self._settle()
        rank_max(0.0)  # start together
        self.left, self.last = math.inf, None
        self._top_up()
        start, end = _timing_events(2)
        start.record()
        host: list[float] = []
        for first in range(0, calls, CHUNK):
            self._chunk(min(CHUNK, calls - first), host)
        end.record()
        while not end.query():
            self._top_up()
        self.left = 0
        self._settle()
        return _seconds(start, end) / calls, statistics.median(host)


def measure_overlap(
    fn: Callable[[], None], sync: Callable[[], None], args
) -> tuple[int, float, float, float]:
    """Returns (calls, s per call of fn under matmuls, host s per call, matmul slowdown in
    percent): the matmul loop under fn's calls against the loop alone (the mean of one run before
    and one after, after a run that settles the clocks). Every rank runs the same counts; times
    are max over ranks."""
    loops = MatmulBeside(fn, sync, args.matmul_size)
    for _ in range(args.warmup):
        loops.alone(1)
    (mm_probe,) = rank_max(loops.alone(PROBE_ITERS) / PROBE_ITERS)
    # A full timed loop, not a few synchronized calls: the call count comes from it.
    call_probe = max(measure(fn, sync, args)[1], 1e-9)
    matmuls = max(MIN_ITERS, round(args.overlap_ms / 1e3 / mm_probe))
    calls = max(MIN_ITERS, round(args.overlap_ms / 1e3 / call_probe))
    loops.alone(matmuls)  # the clocks settle under a full loop first
    before = loops.alone(matmuls)
    loaded = loops.under_calls(matmuls)
    after = loops.alone(matmuls)  # alone again: drift between the runs averages out
    per_call, host = loops.calls_under(calls)
    before, loaded, after, per_call, host = rank_max(before, loaded, after, per_call, host)
    return calls, per_call, host, (2 * loaded / (before + after) - 1) * 100

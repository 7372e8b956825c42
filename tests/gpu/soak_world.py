"""A soak of the failure semantics: many cycles of init -> a random mix of ops -> a random fault ->
destroy, in N long-lived worker processes (--world N, 2 by default), watched by an orchestrator
that enforces deadlines.

    python tests/gpu/soak_world.py --cycles 200 --seed 0 --world 2 --out soak_report.json

needs N GPUs, or fewer and NCCL_HOSTID set (any value: each worker then gets a host of its own,
so that workers can share a GPU as nodes of their own), and no launcher (the script starts its
own processes). tests/gpu/test_soak.py runs a short version from the GPU suite.

Ranks have three roles: rank 0 is the observer, the last rank (N - 1) the faulty one, and the
ranks between them (none at N = 2) are survivors like rank 0 that measure nothing. "Survivors"
below are every rank but the faulty one, rank 0 included.

Processes:
  * the orchestrator (this script without --worker-rank) hosts a TCPStore that outlives every
    worker, starts rank r on cuda:(r % GPU count), waits for each cycle's results with a
    deadline, hands the faulty rank's place to a standby after a planned kill (a successor
    started ahead, torch imported, waiting in the store; it starts the next standby), and writes
    the JSON report. It never touches CUDA.
  * a worker (--worker-rank R) runs cycles from --first-cycle on. Rank 0 lives for the whole soak
    and measures its device memory, file descriptors and threads; ranks 1..N-2 live as long; the
    faulty rank kills itself with SIGKILL in "kill" cycles, and its successor joins at the next
    cycle.

A cycle: a store rendezvous, init_process_group("nccl_core") on a store prefix of its own
("cycle{n}": no key of an earlier cycle, or of a killed process, can be read), the ops of its plan
(results checked), its fault, destroy_process_group. The plan is a pure function of (seed, cycle,
N), so the ranks and the orchestrator agree on it without talking. Faults, and where each rank's
DistBackendError is timed from (every one must come within timeout + slack):
  none   nothing goes wrong; no error may surface.
  skip   the faulty rank stops issuing all-reduces one op before the survivors do: every
         survivor's lonely op must fail ("skip", from that op's start), by its own watchdog's
         timeout or because a survivor that timed out first told it through the store. Once
         every survivor has failed and its GPU is idle, the faulty rank issues one op, which must
         fail because it was told too ("skip_peer", from the first survivor's error).
  abort  one rank, any, calls its backend's abort() between two all-reduces; its next op must
         fail at once ("abort_self"), and every other rank's next op, which the aborted rank
         never joins, must time out or be told through the store by a rank that timed out
         ("abort", from the abort() call).
  kill   the faulty rank leaves a few ops in flight and SIGKILLs itself: every survivor must fail
         ("kill", from the kill).
Times are time.monotonic() (CLOCK_MONOTONIC, one clock for every process of the machine), passed
between ranks through the store.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import faulthandler
import gc
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

FAULTS = ("none", "skip", "abort", "kill")
# Warm-up cycles run every fault once (and every op kind) before rank 0 takes its baseline, so
# that one-time costs (lazily loaded kernels, first-use caches) are not counted as leaks. The
# last one is clean, so the baseline is not taken while a previous fault's teardown settles.
WARMUP_FAULTS = ("skip", "abort", "kill", "none")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# (kind, async_op): each collective both ways, then the kinds that are asynchronous by nature
# (coalesced blocks) or run on the caller's stream (one-sided ops, graph replays).
OP_MENU = (
    *((kind, async_op) for kind in COLLECTIVES for async_op in (False, True)),
    ("batch_isend_irecv", True),
    ("coalescing_manager", True),
    ("one_sided", False),
    ("graph", False),
)
NUMELS = (1, 255, 4096, 65536, 262144)
TRAFFIC_NUMEL = 1 << 16  # the all-reduces that faults are injected between
GRAPH_REPLAYS = 3
MIB = 1 << 20

WAIT_PAST_TIMEOUT_S = 10.0  # how long past the timeout a rank waits before calling it a miss
STORE_TIMEOUT_S = 120.0  # a worker's store calls: longer than a respawn of the faulty rank takes
POLL_S = 0.05

# Store keys. Results and kills live outside the cycle prefixes: the orchestrator reads them.
ABORT_AT_KEY = "soak/abort_at"  # in the cycle's prefix: when the aborting rank called abort()


def quiet_key(rank: int) -> str:
    """In the cycle's prefix: survivor `rank` failed in a "skip" cycle and its GPU is idle."""
    return f"soak/quiet/{rank}"


def result_key(cycle: int, rank: int) -> str:
    return f"soak/result/{cycle}/{rank}"


def killed_key(cycle: int) -> str:
    return f"soak/killed/{cycle}"


def standby_key(spawn: int) -> str:
    """The first cycle of standby process `spawn`, set when it replaces the killed faulty rank."""
    return f"soak/standby/{spawn}"


def faulty_rank(world: int) -> int:
    """The rank that skips ops and is killed: the last, so that rank 0, the observer, and its
    resource series live for the whole soak."""
    return world - 1


# The plan: a pure function of (seed, cycle, world size)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    kind: str
    async_op: bool
    numel: int

    @property
    def label(self) -> str:
        mode = "async " if self.async_op and self.kind in COLLECTIVES else ""
        return f"{mode}{self.kind}[{self.numel}]"


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    kind: str  # one of FAULTS
    at: int  # all-reduces every rank runs before the fault
    async_traffic: bool  # those all-reduces (and the ones after) are async_op=True
    aborter: int  # "abort": the rank that calls abort()
    in_flight: int  # "kill": ops the faulty rank enqueues, and does not wait for, before it dies


@dataclasses.dataclass(frozen=True)
class Plan:
    cycle: int
    ops: tuple[OpSpec, ...]
    fault: FaultSpec


def plan_cycle(seed: int, cycle: int, warmup: int, world: int) -> Plan:
    """What cycle `cycle` does in a world of `world` ranks. Every process computes it for
    itself, so it must depend on nothing but its arguments (random.Random of an int is the same
    in every process)."""
    rng = random.Random(seed * 1_000_003 + cycle)
    if cycle < warmup:
        kinds = rng.sample(OP_MENU, len(OP_MENU))
        fault_kind = WARMUP_FAULTS[cycle % len(WARMUP_FAULTS)]
    else:
        kinds = rng.choices(OP_MENU, k=rng.randint(3, 8))
        fault_kind = rng.choice(FAULTS)
    ops = tuple(OpSpec(kind, async_op, rng.choice(NUMELS)) for kind, async_op in kinds)
    fault = FaultSpec(
        kind=fault_kind,
        at=rng.randint(1, 6),
        async_traffic=rng.random() < 0.5,
        aborter=rng.randrange(world),
        in_flight=rng.randint(1, 4),
    )
    return Plan(cycle, ops, fault)


# Worker: one cycle's context, data and ops


class HostWaitExpired(TimeoutError):
    """The host gave up waiting for the GPU: no DistBackendError came to end the wait."""


@dataclasses.dataclass
class Cycle:
    """What the ops and faults of one cycle need; `result` is what the orchestrator gets."""

    rank: int
    world: int
    device: torch.device
    store: dist.Store  # the soak's store: outlives every cycle and every worker
    cycle_store: dist.Store  # this cycle's prefix of it
    plan: Plan
    timeout_s: float
    windows: bool  # NCCL registers windows here: one-sided ops can run
    result: dict
    phase: str = "init"

    @property
    def faulty(self) -> int:
        return faulty_rank(self.world)

    # Point-to-point and one-sided ops run in a ring: at two ranks both neighbours are the peer.
    @property
    def next_rank(self) -> int:
        return (self.rank + 1) % self.world

    @property
    def prev_rank(self) -> int:
        return (self.rank - 1) % self.world

    @property
    def wait_limit_s(self) -> float:
        return self.timeout_s + WAIT_PAST_TIMEOUT_S


Check = tuple[str, torch.Tensor, torch.Tensor]  # (label, actual, expected)


def data(ctx: Cycle, rank: int, index: int, numel: int, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input to op `index` of this cycle. Small integers in float32, so sums are
    exact; they differ by rank, cycle, op and element, so a stale or misplaced value shows."""
    base = (ctx.plan.cycle * 31 + index * 7 + salt * 3) % 97
    values = torch.arange(numel, device=ctx.device) % 251 + base + 1000 * rank
    return values.float()


def summed(ctx: Cycle, index: int, numel: int, salt: int = 0) -> torch.Tensor:
    return sum(data(ctx, r, index, numel, salt) for r in range(ctx.world))


def unfilled(numel: int, ctx: Cycle) -> torch.Tensor:
    """An output buffer holding a value no op produces, so that an op that wrote nothing fails."""
    return torch.full((numel,), -1.0, device=ctx.device)


def finish(work: dist.Work | None, async_op: bool) -> None:
    if async_op:
        work.wait()


def op_all_reduce(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    tensor = data(ctx, ctx.rank, i, spec.numel)
    finish(dist.all_reduce(tensor, async_op=spec.async_op), spec.async_op)
    return [(spec.label, tensor, summed(ctx, i, spec.numel))]


def op_all_gather(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    out = unfilled(ctx.world * spec.numel, ctx)
    mine = data(ctx, ctx.rank, i, spec.numel)
    finish(dist.all_gather_into_tensor(out, mine, async_op=spec.async_op), spec.async_op)
    expected = torch.cat([data(ctx, r, i, spec.numel) for r in range(ctx.world)])
    return [(spec.label, out, expected)]


def op_reduce_scatter(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    n = spec.numel
    out = unfilled(n, ctx)
    mine = data(ctx, ctx.rank, i, ctx.world * n)
    finish(dist.reduce_scatter_tensor(out, mine, async_op=spec.async_op), spec.async_op)
    expected = summed(ctx, i, ctx.world * n)[ctx.rank * n : (ctx.rank + 1) * n]
    return [(spec.label, out, expected)]


def op_broadcast(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    src = (ctx.plan.cycle + i) % ctx.world
    tensor = data(ctx, ctx.rank, i, spec.numel)
    finish(dist.broadcast(tensor, src=src, async_op=spec.async_op), spec.async_op)
    return [(spec.label, tensor, data(ctx, src, i, spec.numel))]


def op_batch_isend_irecv(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    received = unfilled(spec.numel, ctx)
    batch = [
        dist.P2POp(dist.isend, data(ctx, ctx.rank, i, spec.numel), ctx.next_rank),
        dist.P2POp(dist.irecv, received, ctx.prev_rank),
    ]
    for work in dist.batch_isend_irecv(batch):
        work.wait()
    return [(spec.label, received, data(ctx, ctx.prev_rank, i, spec.numel))]


def op_coalescing_manager(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    """Two all-reduces of different sizes in one coalesced block (start/end on the backend)."""
    numels = (spec.numel, spec.numel + 1)
    tensors = [data(ctx, ctx.rank, i, n, salt=s) for s, n in enumerate(numels)]
    with dist._coalescing_manager(device=ctx.device, async_ops=True) as manager:
        for tensor in tensors:
            dist.all_reduce(tensor)
    manager.wait()
    return [
        (f"{spec.label}#{s}", t, summed(ctx, i, n, salt=s))
        for s, (t, n) in enumerate(zip(tensors, numels, strict=True))
    ]


def refuse(ctx: Cycle, spec: OpSpec, call: Callable[[], object], says: str) -> None:
    """The cross-node contract: `call` raises a NotImplementedError that says `says` before
    anything is enqueued, and the group goes on (the soak's later checks show it still right)."""
    try:
        call()
    except NotImplementedError as refused:
        if says not in str(refused):
            raise
        ctx.result["refused"].append(spec.label)
        return
    raise AssertionError(f"{spec.label} ran where it must be refused ({says})")


def op_one_sided(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    """put_signal into the next rank's window, wait_signal for the previous rank's put into ours.

    The window is registered and, when the tensor goes, deregistered by every rank together;
    the barriers keep any rank from writing into a window that is not ready yet, or from
    dropping its window while a neighbour still uses it."""
    if not ctx.windows:
        ctx.result["skipped"].append(spec.label)
        return []
    import torch_nccl_core
    from torch_nccl_core import ops as one_sided

    numel = max(spec.numel, 1024)
    comm = torch_nccl_core.communicator()
    if not comm.supports_windows:
        # NCCL >= 2.29 without GIN between ranks that are not load/store reachable.
        refuse(ctx, spec, lambda: torch_nccl_core.empty(numel, window=True), "no symmetric memory")
        return []
    window = torch_nccl_core.empty(numel, window=True)
    window.fill_(-1.0)
    torch.cuda.synchronize(ctx.device)
    dist.barrier()
    if comm.lsa_size != comm.size and torch_nccl_core.one_sided_engine() != "nccl":
        # Peers on other nodes (ranks sharing a GPU are nodes of their own) and no NCCL one-sided
        # API (NCCL < 2.29).
        source = data(ctx, ctx.rank, i, numel)
        put = lambda: one_sided.put_signal(source, window, ctx.next_rank)  # noqa: E731
        refuse(ctx, spec, put, "NCCL >= 2.29")
        return []
    one_sided.put_signal(data(ctx, ctx.rank, i, numel), window, ctx.next_rank)
    one_sided.wait_signal(window, ctx.prev_rank)
    received = window.clone()
    torch.cuda.synchronize(ctx.device)
    dist.barrier()
    return [(spec.label, received, data(ctx, ctx.prev_rank, i, numel))]


def op_graph(ctx: Cycle, i: int, spec: OpSpec) -> list[Check]:
    """A CUDA graph that captured an all-reduce (as fault_world.capture_after_eager does),
    replayed with new data each time; destroyed here, before the group, so that destroying the
    group finds no live graph holding its NCCL resources."""
    static = unfilled(spec.numel, ctx)
    side = torch.cuda.Stream(device=ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        dist.all_reduce(static)
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    checks = []
    for replay in range(GRAPH_REPLAYS):
        static.copy_(data(ctx, ctx.rank, i, spec.numel, salt=replay))
        graph.replay()
        label = f"{spec.label} replay {replay}"
        checks.append((label, static.clone(), summed(ctx, i, spec.numel, salt=replay)))
    torch.cuda.synchronize(ctx.device)
    del graph
    return checks


OPS = {
    "all_reduce": op_all_reduce,
    "all_gather": op_all_gather,
    "reduce_scatter": op_reduce_scatter,
    "broadcast": op_broadcast,
    "batch_isend_irecv": op_batch_isend_irecv,
    "coalescing_manager": op_coalescing_manager,
    "one_sided": op_one_sided,
    "graph": op_graph,
}


def run_ops(ctx: Cycle) -> None:
    """The cycle's op mix, then every result compared (after all of them ran, so that a
    mismatch on one rank cannot put the ranks out of step)."""
    checks: list[Check] = []
    for i, spec in enumerate(ctx.plan.ops):
        ctx.phase = f"op {i} {spec.label}"
        checks += OPS[spec.kind](ctx, i, spec)
    ctx.phase = "checking results"
    torch.cuda.synchronize(ctx.device)
    for label, actual, expected in checks:
        if not torch.equal(actual, expected):
            wrong = int((actual != expected).sum())
            ctx.result["failures"].append(f"wrong result: {label}: {wrong} elements differ")
    ctx.result["checks"] = len(checks)


# Worker: faults


class Traffic:
    """All-reduces of one small tensor, each waited for on the host, so that the host never runs
    ahead of the GPU and an injected fault meets the next op. With async ops the host waits
    through Work.wait(timeout); with sync ops by polling an event on the current stream (a sync
    op's failure reaches the host at the next call, once the watchdog's abort ended the
    kernel)."""

    def __init__(self, ctx: Cycle) -> None:
        self.ctx = ctx
        self.async_op = ctx.plan.fault.async_traffic
        self.tensor = torch.ones(TRAFFIC_NUMEL, device=ctx.device)

    def enqueue(self) -> dist.Work | None:
        return dist.all_reduce(self.tensor, op=dist.ReduceOp.MAX, async_op=self.async_op)

    def op(self, limit_s: float) -> None:
        work = self.enqueue()
        if self.async_op:
            work.wait(timeout=timedelta(seconds=limit_s))
        else:
            self.drain(limit_s)

    def drain(self, limit_s: float) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.ctx.device))
        deadline = time.monotonic() + limit_s
        while not event.query():
            if time.monotonic() > deadline:
                raise HostWaitExpired(f"the stream did not drain within {limit_s:.1f}s")
            time.sleep(0.001)

    def run(self, count: int) -> None:
        for _ in range(count):
            self.op(self.ctx.wait_limit_s)

    def until_failure(self) -> tuple[float, dist.DistBackendError] | None:
        """Ops until one raises DistBackendError: (when, the error); None if none did in time.
        Any other exception propagates and is reported as one."""
        deadline = time.monotonic() + self.ctx.wait_limit_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.op(left)
            except dist.DistBackendError as error:
                return time.monotonic(), error
        return None


def store_time(store: dist.Store, keys: list[str], timeout_s: float) -> float:
    """The earliest of the times under `keys`, once every one of them is set."""
    store.wait(keys, timedelta(seconds=timeout_s))
    return min(float(store.get(key).decode()) for key in keys)


def record(
    ctx: Cycle,
    name: str,
    hit: tuple[float, BaseException] | None,
    since: float | None = None,
) -> None:
    """Files this rank's detection `name` (seconds from `since`), or a miss as a failure."""
    if hit is None:
        ctx.result["failures"].append(
            f"{name}: no DistBackendError within {ctx.wait_limit_s:.0f}s of the fault"
        )
        return
    at, error = hit
    ctx.result["detections"][name] = round(at - since, 3) if since is not None else None
    ctx.result["errors"][name] = f"{type(error).__name__}: {error}"[:300]


def fault_none(ctx: Cycle, traffic: Traffic) -> None:
    traffic.run(ctx.plan.fault.at)


def fault_skip(ctx: Cycle, traffic: Traffic) -> None:
    """The faulty rank stops one op early. A survivor's lonely op fails within the timeout of
    its own start either way: by its own watchdog, or sooner, told through the store by a
    survivor whose watchdog timed out first. Each survivor notes its failure only once its own
    GPU is idle (its lonely op ended by the abort), and the faulty rank waits for all of them,
    so that its next op cannot pair with a survivor's."""
    traffic.run(ctx.plan.fault.at)
    if ctx.rank != ctx.faulty:
        failed_at = None
        try:
            injected = time.monotonic()
            hit = traffic.until_failure()
            record(ctx, "skip", hit, injected)
            failed_at = hit[0] if hit else None
            torch.cuda.synchronize(ctx.device)
        finally:
            ctx.cycle_store.set(quiet_key(ctx.rank), str(failed_at or time.monotonic()))
    else:
        # The first survivor's error follows the first timeout, which told the store: timed from
        # it, "skip_peer" also bounds the wait for the slowest survivor to go quiet.
        survivors = [quiet_key(r) for r in range(ctx.world) if r != ctx.faulty]
        first_failed_at = store_time(ctx.cycle_store, survivors, ctx.wait_limit_s + 10)
        record(ctx, "skip_peer", traffic.until_failure(), first_failed_at)


def fault_abort(ctx: Cycle, traffic: Traffic) -> None:
    """One rank aborts between two ops; the others are not told (abort() does not tell peers),
    so their next op, which the aborted rank never joins, times out: by each one's own watchdog,
    or told through the store by the first that timed out. Every rank must see DistBackendError."""
    traffic.run(ctx.plan.fault.at)
    if ctx.rank == ctx.plan.fault.aborter:
        aborted_at = time.monotonic()
        ctx.cycle_store.set(ABORT_AT_KEY, str(aborted_at))
        dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")).abort()
        record(ctx, "abort_self", traffic.until_failure(), aborted_at)
    else:
        hit = traffic.until_failure()
        aborted_at = store_time(ctx.cycle_store, [ABORT_AT_KEY], ctx.wait_limit_s) if hit else None
        record(ctx, "abort", hit, aborted_at)


def fault_kill(ctx: Cycle, traffic: Traffic) -> None:
    """The faulty rank enqueues a few ops without waiting, notes the time and SIGKILLs itself;
    the orchestrator starts its successor. Every survivor must fail, and must not hang."""
    traffic.run(ctx.plan.fault.at)
    if ctx.rank == ctx.faulty:
        for _ in range(ctx.plan.fault.in_flight):
            traffic.enqueue()
        ctx.store.set(killed_key(ctx.plan.cycle), str(time.monotonic()))
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    hit = traffic.until_failure()
    killed_at = (
        store_time(ctx.store, [killed_key(ctx.plan.cycle)], ctx.wait_limit_s) if hit else None
    )
    record(ctx, "kill", hit, killed_at)


FAULT_PHASES = {"none": fault_none, "skip": fault_skip, "abort": fault_abort, "kill": fault_kill}


# Worker: a cycle, resources, the loop


def rendezvous(ctx: Cycle) -> None:
    """Every rank reaches init_process_group together. NCCL's initialization on a nonblocking
    communicator (the default) is bounded by the group's timeout, and one rank may come much
    later than the others: a peer still waiting out a fault, or a fresh faulty rank still
    starting after a kill. The store waits for it without a bound of that kind."""
    ctx.phase = "rendezvous"
    ctx.cycle_store.set(f"soak/ready/{ctx.rank}", "1")
    keys = [f"soak/ready/{r}" for r in range(ctx.world)]
    ctx.cycle_store.wait(keys, timedelta(seconds=STORE_TIMEOUT_S))


def init_group(ctx: Cycle) -> None:
    ctx.phase = "init"
    dist.init_process_group(
        "nccl_core",
        store=ctx.cycle_store,
        rank=ctx.rank,
        world_size=ctx.world,
        timeout=timedelta(seconds=ctx.timeout_s),
        device_id=ctx.device,
    )


def prime_nccl(device: torch.device) -> None:
    """A one-rank group made, used and destroyed once per process, before any cycle: NCCL's
    first initialization in a process (loading its kernels, reading the topology) is its
    slowest, and a cycle's short timeout bounds initialization too."""
    dist.init_process_group(
        "nccl_core", store=dist.HashStore(), rank=0, world_size=1, device_id=device
    )
    dist.all_reduce(torch.ones(1, device=device))
    torch.cuda.synchronize(device)
    dist.destroy_process_group()
    gc.collect()


def destroy_group(ctx: Cycle) -> None:
    """destroy_process_group, timed; objects of the cycle that sit in reference cycles (Work,
    tracebacks) are collected first, so that the group's last references go with it."""
    ctx.phase = "destroy"
    gc.collect()
    if not dist.is_initialized():
        return
    start = time.monotonic()
    try:
        dist.destroy_process_group()
    except Exception as error:
        ctx.result["failures"].append(f"destroy raised {type(error).__name__}: {error}"[:500])
    ctx.result["destroy_s"] = round(time.monotonic() - start, 3)
    gc.collect()


def run_body(ctx: Cycle) -> None:
    rendezvous(ctx)
    init_group(ctx)
    run_ops(ctx)
    ctx.phase = f"fault {ctx.plan.fault.kind}"
    FAULT_PHASES[ctx.plan.fault.kind](ctx, Traffic(ctx))


def run_cycle(
    rank: int, device: torch.device, store: dist.Store, plan: Plan, args: argparse.Namespace
) -> dict:
    """One cycle on this rank; its report. Every exception is caught and reported, so the
    worker goes on with the next cycle (the orchestrator fails the soak at the end)."""
    result = {
        "cycle": plan.cycle,
        "rank": rank,
        "fault": plan.fault.kind,
        "ops": [spec.label for spec in plan.ops],
        "failures": [],
        "detections": {},
        "errors": {},
        "skipped": [],
        "refused": [],
    }
    ctx = Cycle(
        rank=rank,
        world=args.world,
        device=device,
        store=store,
        cycle_store=dist.PrefixStore(f"cycle{plan.cycle}", store),
        plan=plan,
        timeout_s=args.timeout_s,
        windows=args.windows,
        result=result,
    )
    start = time.monotonic()
    try:
        run_body(ctx)
    except Exception as error:  # the faults' expected DistBackendErrors never get here
        what = (
            "a DistBackendError before or outside the injected fault"
            if isinstance(error, dist.DistBackendError)
            else f"a non-DistBackendError {type(error).__name__}"
        )
        result["failures"].append(f"{ctx.phase}: {what}: {error}"[:600])
    finally:
        destroy_group(ctx)
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def resources(device: torch.device) -> dict:
    """What rank 0 must give back after every cycle. Device memory is the whole GPU's use
    (total - free) after the caching allocator released its unused blocks; /proc/self/task
    counts native threads (NCCL's proxies, the watchdog), not only Python ones."""
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return {
        "device_used_mib": round((total - free) / MIB, 1),
        "allocated_bytes": torch.cuda.memory_allocated(device),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
    }


def tolerances(args: argparse.Namespace) -> dict:
    return {
        "device_used_mib": args.mem_tolerance_mib,
        "allocated_bytes": 0,
        "fds": args.fd_tolerance,
        "threads": args.thread_tolerance,
    }


def grown(now: dict, baseline: dict, tolerance: dict) -> dict:
    """The measures that grew past their tolerance since the baseline, and by how much."""
    return {
        key: round(now[key] - baseline[key], 1)
        for key in baseline
        if now[key] - baseline[key] > tolerance[key]
    }


def settled(device: torch.device, baseline: dict, tolerance: dict, seconds: float) -> dict:
    """The end measurement, taken again for up to `seconds` while it is above the baseline:
    a teardown may finish on a thread of its own (NCCL's abort with a graph just released),
    which is not a leak if it ends."""
    deadline = time.monotonic() + seconds
    while True:
        now = resources(device)
        if not grown(now, baseline, tolerance) or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


def die_with_parent(parent_pid: int) -> None:
    """Workers must not outlive the orchestrator (killed by a test's timeout, say): left
    running, they would hold the GPUs. PR_SET_PDEATHSIG asks Linux to SIGKILL this process
    when its parent goes."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != parent_pid:  # the parent went before the request was in place
        os._exit(1)


def await_turn(store: dist.TCPStore, spawn: int) -> int:
    """A standby waits, torch imported but CUDA not started (so it holds no device memory that
    rank 0's series would count), until the orchestrator hands it the killed faulty rank's next
    cycle; returns that cycle."""
    key = standby_key(spawn)
    while not store.check([key]):
        time.sleep(POLL_S)
    return int(store.get(key))


def worker_main(args: argparse.Namespace) -> int:
    die_with_parent(args.parent_pid)
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the orchestrator's hang dump
    torch.set_num_threads(1)  # no CPU thread pool appearing midway in the thread counts
    import torch_nccl_core  # registers "nccl_core"

    store = dist.TCPStore(
        "127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S)
    )
    if args.standby is not None:
        args.first_cycle = await_turn(store, args.standby)
    rank = args.worker_rank
    device = torch.device("cuda", rank % torch.cuda.device_count())  # ranks may share a GPU
    torch.cuda.set_device(device)
    prime_nccl(device)
    args.windows = bool(torch_nccl_core.features().get("window_registration", False))
    baseline = None
    for cycle in range(args.first_cycle, args.cycles):
        plan = plan_cycle(args.seed, cycle, args.warmup, args.world)
        print(f"[rank {rank}] cycle {cycle}: {plan}", flush=True)
        result = run_cycle(rank, device, store, plan, args)
        if rank == 0:
            now = resources(device)
            if cycle == args.warmup - 1:
                baseline = now
            if cycle == args.cycles - 1 and baseline is not None:
                now = settled(device, baseline, tolerances(args), seconds=10.0)
                result["baseline"] = baseline
            result["resources"] = now
        store.set(result_key(cycle, rank), json.dumps(result))
        print(f"[rank {rank}] cycle {cycle} done: {json.dumps(result)}", flush=True)
    return 0


# Orchestrator

LAUNCHER_VARS = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)


def worker_env(rank: int) -> dict[str, str]:
    """The workers' environment: no launcher variables (the suite runs under torchrun), NCCL's
    bootstrap over loopback as in helpers._child_world_env. Where this process has an
    NCCL_HOSTID (ranks sharing a GPU, torch_nccl_core.launch), each worker gets one of its own:
    NCCL refuses two ranks of one host on one GPU.

    NCCL's RAS is off unless NCCL_RAS_ENABLE says otherwise: after a kill, the survivors' RAS
    threads keep reconnecting to the dead rank's RAS port, and on one host the kernel hands that
    port to a later listener, e.g. a survivor's socket transport. NCCL 2.28.9 then fails that
    communicator's first op with ncclInternalError ("socketFinalizeAccept ...: wrong type 5 != 3",
    a RAS connection on a transport listener): a fault of NCCL's, not one the soak injects
    (docs/design.md, failure table)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith("TORCHELASTIC")
    }
    env.update(NCCL_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env.setdefault("NCCL_RAS_ENABLE", "0")
    if "NCCL_HOSTID" in env:
        env["NCCL_HOSTID"] = f"{env['NCCL_HOSTID']}-soak{rank}"
    return env


def expected_detections(plan: Plan, world: int) -> dict[int, str]:
    """The detection each rank must report in `plan`'s cycle: the rank that skips or aborts one
    of its own, every other rank the fault's; a killed rank none."""
    fault = plan.fault
    if fault.kind == "abort":
        return {r: "abort_self" if r == fault.aborter else "abort" for r in range(world)}
    faulty = faulty_rank(world)
    if fault.kind == "skip":
        return {r: "skip_peer" if r == faulty else "skip" for r in range(world)}
    if fault.kind == "kill":
        return {r: "kill" for r in range(world) if r != faulty}
    return {}


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"<{error}>"


class Soak:
    """Starts and watches the workers, collects each cycle's results in order, and judges them.

    A cycle is done when every rank that should report has (the faulty rank does not in "kill"
    cycles, where it must instead die of SIGKILL after noting the kill). It must be done within
    the cycle deadline, or the soak stops as hung."""

    def __init__(self, args: argparse.Namespace, store: dist.TCPStore, log_dir: Path) -> None:
        self.args = args
        self.faulty = faulty_rank(args.world)
        self.store = store
        self.log_dir = log_dir
        self.workers: dict[int, subprocess.Popen] = {}
        self.standby: tuple[int, subprocess.Popen] | None = None  # (spawn number, process)
        self.idle_log: Path | None = None  # the waiting standby's, empty
        self.logs: list[Path] = []
        self.spawns = 0
        self.respawns = 0
        self.results: dict[int, dict[int, dict]] = collections.defaultdict(dict)
        self.killed: set[int] = set()
        self.failures: list[str] = []
        self.fatal = False
        self.cycles_done = 0
        self.start = time.monotonic()

    # processes

    def worker_command(self, rank: int, start_args: list[str]) -> list[str]:
        a = self.args
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            *("--worker-rank", str(rank), "--world", str(a.world), "--port", str(self.store.port)),
            *start_args,
            *("--parent-pid", str(os.getpid())),
            *("--cycles", str(a.cycles), "--seed", str(a.seed), "--warmup", str(a.warmup)),
            *("--timeout-s", str(a.timeout_s), "--mem-tolerance-mib", str(a.mem_tolerance_mib)),
            *("--fd-tolerance", str(a.fd_tolerance), "--thread-tolerance", str(a.thread_tolerance)),
        ]

    def start_process(self, rank: int, start_args: list[str], label: str) -> subprocess.Popen:
        log = self.log_dir / f"rank{rank}-spawn{self.spawns}-{label}.log"
        self.spawns += 1
        self.logs.append(log)
        with open(log, "w") as sink:
            return subprocess.Popen(
                self.worker_command(rank, start_args),
                env=worker_env(rank),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def spawn(self, rank: int, first_cycle: int) -> None:
        self.workers[rank] = self.start_process(
            rank, ["--first-cycle", str(first_cycle)], f"from-cycle{first_cycle}"
        )

    def spawn_standby(self, first_cycle: int) -> None:
        """Starts the faulty rank's successor ahead of the next kill from `first_cycle` on, if
        one is planned: the cycle after a kill then waits for it to start CUDA and NCCL only,
        not for a new interpreter to import torch (about 3 s of every such cycle, measured)."""
        last = self.args.cycles - 1  # a kill in the last cycle has no successor
        if any(self.plan(c).fault.kind == "kill" for c in range(first_cycle, last)):
            spawn = self.spawns
            self.standby = (
                spawn,
                self.start_process(self.faulty, ["--standby", str(spawn)], "standby"),
            )
            self.idle_log = self.logs[-1]

    def replace_faulty(self, first_cycle: int) -> None:
        """The killed faulty rank's successor runs from `first_cycle` on: the standby, or a new
        process where there is none."""
        self.respawns += 1
        if self.standby is None:
            self.spawn(self.faulty, first_cycle)
        else:
            spawn, proc = self.standby
            self.standby, self.idle_log = None, None
            self.store.set(standby_key(spawn), str(first_cycle))
            self.workers[self.faulty] = proc
        self.spawn_standby(first_cycle)

    def stop_workers(self, dump_stacks: bool = False) -> None:
        """SIGKILL every worker still running; with dump_stacks, have them print their Python
        stacks to their logs first (faulthandler on SIGUSR1)."""
        procs = [*self.workers.values(), *([self.standby[1]] if self.standby else [])]
        if dump_stacks and procs:
            for proc in procs:
                proc.send_signal(signal.SIGUSR1)
            time.sleep(2.0)
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        self.workers.clear()
        self.standby = None

    def watch_workers(self, cycle: int) -> None:
        """Handles workers that exited: the faulty rank killed as planned is replaced, a worker
        done with its cycles is let go, anything else (the standby's exit too) stops the soak."""
        if self.standby is not None and self.standby[1].poll() is not None:
            self.fail(
                f"the faulty rank's standby exited with rc {self.standby[1].returncode}"
                f" during cycle {cycle}",
                fatal=True,
            )
            self.standby = None
        for rank, proc in list(self.workers.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.workers[rank]
            if rc == 0:
                continue  # it ran its last cycle; a missing result shows in collect()
            killed = (
                self.planned_kill(cycle) if rank == self.faulty and rc == -signal.SIGKILL else None
            )
            if killed is None:
                self.fail(f"rank {rank} exited with rc {rc} during cycle {cycle}", fatal=True)
                continue
            self.killed.add(killed)
            if killed + 1 < self.args.cycles:
                self.replace_faulty(killed + 1)

    def planned_kill(self, cycle: int) -> int | None:
        """The kill cycle the faulty rank died in, if it died in one: the first cycle from
        `cycle` on (the faulty rank may run ahead of the orchestrator's bookkeeping) that plans a
        kill and whose kill the faulty rank noted in the store."""
        for candidate in range(cycle, self.args.cycles):
            if candidate in self.killed or self.plan(candidate).fault.kind != "kill":
                continue
            if self.store.check([killed_key(candidate)]):
                return candidate
        return None

    # cycles

    def plan(self, cycle: int) -> Plan:
        a = self.args
        return plan_cycle(a.seed, cycle, a.warmup, a.world)

    def fail(self, message: str, fatal: bool = False) -> None:
        self.failures.append(message)
        self.fatal = self.fatal or fatal

    def collect(self, cycle: int, plan: Plan) -> bool:
        """Whether every result cycle `cycle` owes is in (reading them as they come)."""
        killed = plan.fault.kind == "kill"
        owed = [r for r in range(self.args.world) if not (killed and r == self.faulty)]
        for rank in owed:
            if rank in self.results[cycle]:
                continue
            if not self.store.check([result_key(cycle, rank)]):
                if rank not in self.workers:
                    self.fail(f"rank {rank} is gone without a result for cycle {cycle}", True)
                return False
            self.results[cycle][rank] = json.loads(self.store.get(result_key(cycle, rank)))
        return not killed or cycle in self.killed

    def await_cycle(self, cycle: int) -> bool:
        plan = self.plan(cycle)
        deadline = time.monotonic() + self.args.cycle_deadline_s
        while True:
            self.watch_workers(cycle)
            if not self.fatal and self.collect(cycle, plan):
                return True
            if self.fatal:
                return False
            if time.monotonic() > deadline:
                have = sorted(self.results[cycle])
                self.fail(
                    f"hang: cycle {cycle} ({plan.fault.kind}, ops {[s.label for s in plan.ops]})"
                    f" unfinished after {self.args.cycle_deadline_s:.0f}s; results from ranks"
                    f" {have}; stacks in the logs",
                    fatal=True,
                )
                self.stop_workers(dump_stacks=True)
                return False
            time.sleep(POLL_S)

    def await_exit(self) -> None:
        deadline = time.monotonic() + self.args.cycle_deadline_s
        while self.workers and time.monotonic() < deadline:
            for rank, proc in list(self.workers.items()):
                if proc.poll() is not None:
                    del self.workers[rank]
                    if proc.returncode != 0:
                        self.fail(f"rank {rank} exited with rc {proc.returncode} after the soak")
            time.sleep(POLL_S)
        if self.workers:
            self.fail(f"ranks {sorted(self.workers)} did not exit after the last cycle")
            self.stop_workers(dump_stacks=True)

    def run(self) -> None:
        for rank in range(self.args.world):
            self.spawn(rank, 0)
        self.spawn_standby(0)
        for cycle in range(self.args.cycles):
            if not self.await_cycle(cycle):
                return
            self.cycles_done = cycle + 1
            print(f"cycle {cycle} done ({time.monotonic() - self.start:.0f}s)", flush=True)
        self.await_exit()

    # verdict and report

    def judge(self) -> dict:
        """Failures from the results; the detection latencies and resource series."""
        limit = self.args.timeout_s + self.args.slack_s
        destroy_limit = self.args.timeout_s + 5.0 + self.args.slack_s  # design: timeout + 5 s
        latencies: dict[str, list[float]] = collections.defaultdict(list)
        examples: dict[str, str] = {}
        for cycle in range(self.cycles_done):
            plan = self.plan(cycle)
            for rank, result in sorted(self.results[cycle].items()):
                where = f"cycle {cycle} ({plan.fault.kind}) rank {rank}"
                self.failures += [f"{where}: {f}" for f in result["failures"]]
                if result.get("destroy_s", 0.0) > destroy_limit:
                    self.fail(f"{where}: destroy took {result['destroy_s']}s (> {destroy_limit}s)")
                for name, seconds in result["detections"].items():
                    if seconds is None:
                        continue
                    latencies[name].append(seconds)
                    examples.setdefault(name, result["errors"].get(name, ""))
                    if not 0.0 <= seconds <= limit:
                        self.fail(f"{where}: {name} surfaced after {seconds}s (limit {limit}s)")
                wanted = expected_detections(plan, self.args.world).get(rank)
                if wanted and wanted not in result["detections"] and not result["failures"]:
                    self.fail(f"{where}: no {wanted} detection reported")
        return {
            "limit_s": limit,
            "by_fault": {
                name: {
                    "count": len(values),
                    "max": max(values),
                    "mean": round(sum(values) / len(values), 3),
                }
                for name, values in sorted(latencies.items())
            },
            "example_errors": examples,
        }

    def judge_resources(self) -> dict:
        series = [
            {"cycle": c, **self.results[c][0]["resources"]}
            for c in range(self.cycles_done)
            if "resources" in self.results[c].get(0, {})
        ]
        report = {"tolerance": tolerances(self.args), "per_cycle": series}
        last = self.results.get(self.args.cycles - 1, {}).get(0, {})
        if self.cycles_done < self.args.cycles or "baseline" not in last:
            report["checked"] = False
            return report
        baseline, end = last["baseline"], last["resources"]
        growth = grown(end, baseline, tolerances(self.args))
        report.update(checked=True, baseline=baseline, end=end, leaked=growth)
        if growth:
            self.fail(f"leak: rank 0 ended above its post-warm-up baseline: {growth}")
        return report

    def report(self) -> dict:
        detection = self.judge()
        resources_report = self.judge_resources()
        faults = collections.Counter(self.plan(c).fault.kind for c in range(self.cycles_done))
        ops = collections.Counter(
            spec.kind for c in range(self.cycles_done) for spec in self.plan(c).ops
        )
        cycle_seconds = [
            r["seconds"] for c in range(self.cycles_done) for r in self.results[c].values()
        ]
        report = {
            "ok": not self.failures,
            "cycles_requested": self.args.cycles,
            "cycles_run": self.cycles_done,
            "world": self.args.world,
            "seed": self.args.seed,
            "timeout_s": self.args.timeout_s,
            "warmup_cycles": self.args.warmup,
            "faults": {kind: faults.get(kind, 0) for kind in FAULTS},
            "ops": dict(sorted(ops.items())),
            "checks_passed": sum(
                r.get("checks", 0)
                for c in range(self.cycles_done)
                for r in self.results[c].values()
            ),
            "one_sided_skipped": any(
                r.get("skipped") for c in range(self.cycles_done) for r in self.results[c].values()
            ),
            "one_sided_refused": any(
                r.get("refused") for c in range(self.cycles_done) for r in self.results[c].values()
            ),
            "respawns": self.respawns,
            "detection_s": detection,
            "cycle_seconds_max": max(cycle_seconds, default=0.0),
            "resources": resources_report,
            "elapsed_s": round(time.monotonic() - self.start, 1),
            "failures": self.failures,
            "logs": str(self.log_dir),
        }
        if self.failures:
            logs = [p for p in self.logs if p != self.idle_log]
            report["log_tails"] = {str(p): log_tail(p) for p in logs[-3:]}
        return report


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    log_dir = out.parent / f"{out.stem}_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM (a test's cleanup, say) unwinds through the finally below: workers stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    soak = Soak(args, store, log_dir)
    try:
        soak.run()
    except BaseException as error:
        soak.fail(f"orchestrator: {type(error).__name__}: {error}", fatal=True)
        raise
    finally:
        soak.stop_workers()
        report = soak.report()
        out.write_text(json.dumps(report, indent=1) + "\n")
        summary = {
            k: report[k] for k in ("ok", "world", "cycles_run", "faults", "respawns", "elapsed_s")
        }
        summary["max_detection_s"] = {
            name: v["max"] for name, v in report["detection_s"]["by_fault"].items()
        }
        summary["failures"] = report["failures"][:20]
        print(json.dumps(summary), flush=True)
    return 0 if report["ok"] else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--world", type=int, default=2, help="ranks: 0 observes, the last is the faulty one"
    )
    parser.add_argument("--out", default="soak_report.json")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="the groups' timeout")
    parser.add_argument(
        "--slack-s", type=float, default=2.0, help="allowed past the timeout to surface a fault"
    )
    parser.add_argument(
        "--warmup", type=int, default=len(WARMUP_FAULTS), help="cycles before the baseline"
    )
    parser.add_argument("--cycle-deadline-s", type=float, default=60.0)
    # One cuMem granule is 2 MiB. After warm-up, CUDA's lazy module loading and the driver's
    # own pools may still take a few granules once; a leaked communicator costs far more (NCCL's
    # channel buffers alone are tens to hundreds of MiB on NVLink), and a leak of one granule a
    # cycle passes 16 MiB within 9 measured cycles.
    parser.add_argument("--mem-tolerance-mib", type=float, default=16.0)
    parser.add_argument("--fd-tolerance", type=int, default=0)
    parser.add_argument("--thread-tolerance", type=int, default=0)
    # worker mode (started by the orchestrator)
    parser.add_argument("--worker-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first-cycle", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--standby", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.warmup < 0:
        parser.error("--cycles must be positive and --warmup not negative")
    if args.world < 2:
        parser.error(
            f"--world must be at least 2 (rank 0 observes, the last rank is the faulty one),"
            f" got {args.world}"
        )
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.worker_rank is None:
        sys.exit(orchestrate(arguments))
    sys.exit(worker_main(arguments))

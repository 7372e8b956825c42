"""One rank of a world of two processes (more where a scenario says so) that runs one
failure-semantics scenario, then prints a JSON line of what it saw. The parent test asserts on
it, and on this process ending in time with exit code 0: a hang or crash is the failure being
looked for.

Started by test_failure_semantics.py, one process per rank, with RANK / WORLD_SIZE / MASTER_ADDR
/ MASTER_PORT set. Scenarios set and bind cuda:RANK % GPU count (ranks may share a GPU), except
those that show what happens when a program does neither.
"""

import functools
import gc
import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_nccl_core

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEVICE = torch.device("cuda", RANK % torch.cuda.device_count())  # ranks may share a GPU
INITS = itertools.count()  # init() calls of this process: a meeting each
NUMEL = 4 << 20  # 16 MiB of float32: each all_reduce keeps the GPU busy for a while


def store() -> dist.TCPStore:
    """The job's store, kept across re-initialization as torchrun's agent store is."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD,
        is_master=RANK == 0,
        timeout=timedelta(seconds=60),
    )


def init(job_store, timeout_s: float = 30.0, bind: bool = True, meet_first: bool = True) -> None:
    if meet_first:
        # The processes started seconds apart, and the group's timeout bounds its initialization.
        meet(job_store, f"init_{next(INITS)}")
    if bind:
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(
        "nccl_core",
        store=job_store,
        rank=RANK,
        world_size=WORLD,
        timeout=timedelta(seconds=timeout_s),
        device_id=DEVICE if bind else None,
    )


def summed(value: float, world: int = WORLD) -> float:
    """What an all_reduce of `value + rank` over a world of `world` ranks gives."""
    return sum(value + r for r in range(world))


def probe() -> bool:
    """One all_reduce over the default group (a shrink may have made it smaller); whether it
    gave the right sum."""
    t = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    dist.all_reduce(t)
    return bool((t == summed(1.0, dist.get_world_size())).all())


def destroy_after_sync_ops(job_store) -> dict:
    """Synchronous all_reduces, ranks out of step, then destroy at once: no op is cut short."""
    init(job_store, bind=False)
    tensors = [torch.full((NUMEL,), float(i) + RANK, device=DEVICE) for i in range(8)]
    # The lazy communicator is created collectively by the first op: without this one, that
    # creation would absorb rank 1's delay and put the ranks back in step.
    probe()
    if RANK == 1:
        time.sleep(1.0)
    for t in tensors:
        dist.all_reduce(t)
    dist.destroy_process_group()
    gc.collect()  # the group's last reference may sit in a cycle: its backend goes here
    torch.cuda.synchronize(DEVICE)
    return {"correct": all(bool((t == summed(i)).all()) for i, t in enumerate(tensors))}


def host_ahead_of_gpu(job_store) -> dict:
    """A healthy loop of sync ops, the host 8 ops ahead, for 3x the timeout: never aborted."""
    timeout_s = 3.0
    init(job_store, timeout_s)
    t = torch.ones(NUMEL, device=DEVICE)
    events = []
    iterations, stop_at = 0, None
    error = None
    start = time.monotonic()
    try:
        # Both ranks must run the same count: rank 0 picks it, well ahead, through the store
        # (no op that would drain the queue), and rank 1 looks for it every 50 ops.
        while stop_at is None or iterations < stop_at:
            dist.all_reduce(t)
            t.mul_(0.5)  # keeps values bounded: 1 -> 2 * 0.5
            events.append(torch.cuda.Event())
            events[-1].record()
            if len(events) > 8:
                events.pop(0).synchronize()
            iterations += 1
            if stop_at is not None:
                continue
            if RANK == 0 and time.monotonic() - start >= 3 * timeout_s:
                stop_at = iterations + 1000
                job_store.set("stop_at", str(stop_at))
            elif RANK != 0 and iterations % 50 == 0 and job_store.check(["stop_at"]):
                stop_at = int(job_store.get("stop_at"))
        torch.cuda.synchronize()
        correct = probe() and bool((t == 1.0).all())
    except Exception as e:  # reported to the parent
        error, correct = repr(e), False
    seconds = time.monotonic() - start
    dist.destroy_process_group()
    return {"iterations": iterations, "seconds": seconds, "error": error, "correct": correct}


def capture_after_eager(job_store) -> dict:
    """Eager traffic, then a capture in each mode at once: graphs replay right, group works."""
    init(job_store)
    results = {}
    for mode in ("global", "thread_local", "relaxed"):
        busy = [torch.ones(NUMEL, device=DEVICE) for _ in range(4)]
        for b in busy[:2]:
            dist.all_reduce(b)
        works = [dist.all_reduce(b, async_op=True) for b in busy[2:]]
        static = torch.zeros(1024, device=DEVICE)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            with torch.cuda.graph(graph, stream=side, capture_error_mode=mode):
                time.sleep(0.3)  # the watchdog polls meanwhile
                dist.all_reduce(static)
        torch.cuda.current_stream().wait_stream(side)
        for w in works:
            w.wait()
        replays = []
        for i in range(10):
            static.fill_(float(i) + RANK)
            graph.replay()
            replays.append(bool((static == summed(i)).all()))
        torch.cuda.synchronize()
        results[mode] = {"replays_correct": all(replays), "eager_after": probe()}
        del graph
    dist.destroy_process_group()
    return results


def all_reduce_graph(static: torch.Tensor) -> torch.cuda.CUDAGraph:
    """A CUDA graph that captured an all_reduce of `static` over the default group, on a side
    stream (capture needs one other than the default stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
    return graph


def teardown_with_live_graph(job_store, how: str) -> dict:
    """destroy / abort / interpreter exit while a graph that captured the group is alive."""
    init(job_store)
    static = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    graph = all_reduce_graph(static)
    graph.replay()
    torch.cuda.synchronize()
    replayed = bool((static == summed(1.0)).all())
    start = time.monotonic()
    if how == "destroy":
        dist.destroy_process_group()
    elif how == "abort":
        dist.distributed_c10d._get_default_group()._get_backend(DEVICE).abort()
    teardown_s = time.monotonic() - start
    report = {"replayed": replayed, "teardown_s": teardown_s}
    if how != "exit":
        start = time.monotonic()
        graph.replay()  # undefined results, but it must neither hang nor crash
        torch.cuda.synchronize()
        report["replay_after_s"] = time.monotonic() - start
    # "exit": the interpreter exits with the group and the graph alive
    global KEEP_ALIVE
    KEEP_ALIVE = graph
    return report


def reinit_after_failure(job_store) -> dict:
    """A timeout, destroy, re-init under the same names; then a clean re-init, rank 0 late."""
    init(job_store, timeout_s=3.0)
    first = probe()
    failed = None
    if RANK == 0:  # rank 1 skips this all_reduce
        try:
            t = torch.ones(16, device=DEVICE)
            dist.all_reduce(t)
            torch.cuda.synchronize()
            dist.all_reduce(t)
        except dist.DistBackendError as e:
            failed = str(e)
    job_store.set(f"failed_seen_{RANK}", "1")
    job_store.wait([f"failed_seen_{r}" for r in range(WORLD)])
    time.sleep(2.5)  # rank 1's watchdog reads the abort marker meanwhile
    dist.destroy_process_group()
    init(job_store, timeout_s=10.0)
    time.sleep(2.0)  # a stale abort marker would be read by now
    after_failure = probe()
    dist.destroy_process_group()
    meet(job_store, "before_late_init")
    if RANK == 0:
        time.sleep(3.0)
    init(job_store, timeout_s=10.0, meet_first=False)  # rank 0 late, within the timeout
    after_late = probe()
    dist.destroy_process_group()
    return {
        "first": first,
        "rank0_failure": failed,
        "after_failure": after_failure,
        "after_late": after_late,
    }


def one_shot_peer_silent(job_store) -> dict:
    """Rank 1 skips a one-shot all_reduce (Options.all_reduce_kernels): rank 0's kernel waits
    for it at the ranks' meeting until the watchdog times the op out and aborts the
    communicator, which ends the wait; the op fails naming itself, and destroy returns."""
    init(job_store)
    group = dist.new_group(
        backend="nccl_core",
        timeout=timedelta(seconds=3.0),
        pg_options=torch_nccl_core.Options(all_reduce_kernels="one_shot"),
    )
    comm = torch_nccl_core.communicator(group)
    t = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    dist.all_reduce(t, group=group)  # both ranks: makes the staging
    torch.cuda.synchronize()
    report: dict = {"first": bool((t == summed(1.0)).all()), "lsa": comm.lsa_size == comm.size}
    if not report["lsa"]:  # NCCL runs it: nothing of the kernel's to test
        dist.destroy_process_group()
        return report
    if RANK == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(t, group=group)
            torch.cuda.synchronize()  # returns once the abort ended the kernel's wait
            dist.all_reduce(t, group=group)
            report["rank0_failure"] = None
        except dist.DistBackendError as e:
            report["rank0_failure"] = str(e)
        report["failed_after_s"] = time.monotonic() - start
    job_store.set(f"one_shot_seen_{RANK}", "1")
    job_store.wait([f"one_shot_seen_{r}" for r in range(WORLD)])
    start = time.monotonic()
    dist.destroy_process_group()
    report["destroy_s"] = time.monotonic() - start
    return report


def shrink_past_a_silent_rank(job_store) -> dict:
    """Rank 1 stops taking part; rank 0, its all_reduce hung on rank 1, shrinks the world with
    SHRINK_ABORT well within the timeout and goes on alone: the hung op fails (it never
    finished), the shrunk world computes, and destroy returns at once."""
    timeout_s = 60.0
    init(job_store, timeout_s)
    first = probe()
    report: dict = {"first": first}
    if RANK == 0:
        hung = dist.all_reduce(torch.ones(NUMEL, device=DEVICE), async_op=True)
        time.sleep(0.5)
        start = time.monotonic()
        dist.shrink_group([1], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
        report["shrink_s"] = time.monotonic() - start
        try:
            hung.wait()
            report["hung_op"] = "completed"
        except dist.DistBackendError as e:
            report["hung_op"] = str(e)
        report["world"] = dist.get_world_size()
        report["after"] = probe()
        start = time.monotonic()
        dist.destroy_process_group()
        report["destroy_s"] = time.monotonic() - start
        job_store.set("shrunk", "1")
    else:
        job_store.wait(["shrunk"], timedelta(seconds=timeout_s))
        dist.destroy_process_group()
    return report


def flight_recorder_names_a_skipped_collective(job_store) -> dict:
    """Rank 1 skips the 5th all_reduce: the others time out, every rank dumps its flight
    recorder (TORCH_NCCL_DUMP_ON_TIMEOUT), and torch's analyzer names collective 5 and rank 1."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    folder = f"/tmp/nccl_core_fr_{os.environ['MASTER_PORT']}"
    os.makedirs(folder, exist_ok=True)
    os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = f"{folder}/nccl_trace_rank_"
    init(job_store, timeout_s=5.0)
    t = torch.ones(1024, device=DEVICE)
    for _ in range(4):
        dist.all_reduce(t)
    error = None
    if RANK != 1:  # rank 1 never joins this one
        try:
            dist.all_reduce(t)
            torch.cuda.synchronize()
            dist.all_reduce(t)
        except dist.DistBackendError as e:
            error = str(e)
    dumps = [f"{folder}/nccl_trace_rank_{r}" for r in range(WORLD)]
    deadline = time.monotonic() + 30
    while not all(os.path.exists(d) for d in dumps) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the writer closes its file
    flagged = None
    if RANK == 0 and all(os.path.exists(d) for d in dumps):
        args = JobConfig().parse_args([folder, "--prefix", "nccl_trace_rank_"])
        details, version = read_dir(args)
        db = build_db(details, args, version)
        flagged = [
            (c.collective_seq_id, sorted(c.missing_ranks))
            for c in db.collectives
            if c.missing_ranks
        ]
    job_store.set(f"analyzed_{RANK}", "1")
    job_store.wait([f"analyzed_{r}" for r in range(WORLD)])
    dist.destroy_process_group()
    return {"error": error, "dumped": [os.path.exists(d) for d in dumps], "flagged": flagged}


def watchdog_frees_nothing(job_store) -> dict:
    """The watchdog retires Work holding the last reference to NCCL memory, while a later op
    hangs: freeing that memory waits for the device, so the watchdog must not do it."""
    timeout_s = 5.0
    init(job_store, timeout_s)
    memory = torch_nccl_core.empty(NUMEL)
    memory.fill_(1.0)
    if RANK == 1:
        time.sleep(0.5)  # rank 0's op completes only after it dropped its references
    work = dist.all_reduce(memory, async_op=True)
    error, elapsed = None, 0.0
    if RANK == 0:  # rank 1 never joins the second all_reduce
        lonely = torch.ones(16, device=DEVICE)
        start = time.monotonic()
        late = dist.all_reduce(lonely, async_op=True)
        del memory, work  # the watchdog now holds the last reference
        try:
            late.wait(timeout=timedelta(seconds=30))
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        elapsed = time.monotonic() - start
    else:
        work.wait()
        del memory, work
    job_store.set(f"done_{RANK}", "1")
    job_store.wait([f"done_{r}" for r in range(WORLD)])
    start = time.monotonic()
    dist.destroy_process_group()
    return {"error": error, "elapsed_s": elapsed, "destroy_s": time.monotonic() - start}


def no_set_device(job_store) -> dict:
    """No device bound or set: a barrier first, then ops on cuda:rank with cuda:0 current."""
    init(job_store, bind=False)
    dist.barrier()
    t = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    torch.cuda.synchronize(DEVICE)
    current = torch.cuda.current_device()
    dist.destroy_process_group()
    return {"correct": bool((t == 2 * summed(1.0)).all()), "current_device": current}


def concurrent_first_use(job_store) -> dict:
    """No device bound: two threads of rank 0 ask for the group's communicator at once, its
    first use. One makes it (collectively, with rank 1's one call), the other waits for it and
    gets the same one; then the group computes."""
    init(job_store, bind=False)
    report = {}
    if RANK == 0:
        start = threading.Barrier(2)

        def first_use() -> tuple[int, int]:
            start.wait()
            comm = torch_nccl_core.communicator()
            return comm.size, comm.device

        workers = [Worker(first_use, f"first_use_{i}") for i in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(THREAD_LIMIT_S)
        report["threads"] = [worker.report() for worker in workers]
        report["results"] = [worker.result for worker in workers]
        if any(worker.is_alive() for worker in workers):
            return report  # a hang: rank 1 would wait in the probe for ever
    else:
        torch_nccl_core.communicator()
    report["correct"] = probe()
    dist.destroy_process_group()
    return report


# --- Teardown and frees on other threads (the requirement 6) ----------------------------
#
# "A backend dropped from any thread, GIL held or not, never deadlocks"; "freeing NCCL memory
# never holds the GIL across a device synchronize". Each scenario keeps the GPU busy for BUSY_S
# first (a calibrated torch.cuda._sleep on the current stream, which the queued collectives wait
# for), so that the teardown or free really happens while work is pending.

BUSY_S = 1.5  # how long the GPU stays busy ahead of the queued work
THREAD_LIMIT_S = 30.0  # how long the main thread waits for a worker before it reports a hang
_SLEEP_CYCLES_PER_S: float | None = None


def gpu_busy(seconds: float) -> None:
    """Keeps the current stream busy for about `seconds` (torch.cuda._sleep, calibrated once)."""
    global _SLEEP_CYCLES_PER_S
    if _SLEEP_CYCLES_PER_S is None:
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # warm-up: the first launch loads the kernel
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_S = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)
    torch.cuda._sleep(int(_SLEEP_CYCLES_PER_S * seconds))


class Worker(threading.Thread):
    """Runs `fn` on a Python thread; keeps what it returned or raised, and how long it took."""

    def __init__(self, fn: Callable[[], object], name: str) -> None:
        super().__init__(name=name, daemon=True)  # a hung worker must not hold up the report
        self.fn = fn
        self.result: object = None
        self.error: str | None = None
        self.seconds: float | None = None

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.result = self.fn()
        except BaseException as e:  # reported to the parent
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.seconds = time.monotonic() - start

    def report(self) -> dict:
        return {"thread_done": not self.is_alive(), "thread_s": self.seconds, "error": self.error}


def spin_while(alive: Callable[[], bool], limit_s: float = THREAD_LIMIT_S) -> dict:
    """A busy pure-Python loop while `alive()`: it holds the GIL but for the interpreter's
    switches, and its longest stall between two iterations is how long another thread kept the
    GIL from it."""
    start = last = time.monotonic()
    longest, iterations = 0.0, 0
    while alive() and last - start < limit_s:
        now = time.monotonic()
        longest = max(longest, now - last)
        last = now
        iterations += 1
    return {"spin_s": last - start, "longest_stall_s": longest, "iterations": iterations}


def beside_spin(fn: Callable[[], object], name: str, works: list | None = None) -> dict:
    """Runs `fn` on a worker thread while this thread spins in Python, then lets go of `works`
    (the queued ops' Work) and waits for the device: the worker's report and the spin's."""
    worker = Worker(fn, name)
    worker.start()
    spin = spin_while(worker.is_alive)
    worker.join(THREAD_LIMIT_S)
    if works is not None:
        works.clear()
    torch.cuda.synchronize(DEVICE)
    return {**worker.report(), **spin, "result": worker.result}


def meet(job_store, name: str, timeout_s: float = 60.0) -> bool:
    """A store barrier that gives up after `timeout_s` (or at once when the peer's store is
    gone), so that no rank waits forever for a peer that hung or crashed."""
    job_store.set(f"{name}_{RANK}", "1")
    try:
        job_store.wait([f"{name}_{r}" for r in range(WORLD)], timedelta(seconds=timeout_s))
    except Exception:  # a timeout, or rank 0's store server gone
        return False
    return True


def queued_all_reduces(all_reduce: Callable[[torch.Tensor], object]) -> tuple[list, list]:
    """Four 16 MiB all_reduces queued behind BUSY_S of GPU work: (tensors, what they returned)."""
    tensors = [torch.full((NUMEL,), float(i) + RANK, device=DEVICE) for i in range(4)]
    gpu_busy(BUSY_S)
    return tensors, [all_reduce(t) for t in tensors]


def all_summed(tensors: list) -> bool:
    """Whether tensor i holds summed(i); call after the device is synchronized."""
    return all(bool((t == summed(i)).all()) for i, t in enumerate(tensors))


def destroy_world_on_thread(job_store) -> dict:
    """destroy_process_group() on a Python thread, async all_reduces still queued: the default
    group's last reference goes there, while the main thread spins in Python."""
    init(job_store)
    probe()
    tensors, works = queued_all_reduces(lambda t: dist.all_reduce(t, async_op=True))

    def destroy() -> None:
        dist.destroy_process_group()
        gc.collect()  # the group's last reference may sit in a cycle: its backend goes here

    outcome = beside_spin(destroy, "destroyer", works)
    return {**outcome, "correct": all_summed(tensors)}


def drop_subgroup_on_thread(job_store) -> dict:
    """A new_group with async all_reduces queued: a Python thread destroys it and drops the last
    references to the group and its backend, while the main thread spins in Python."""
    init(job_store)
    group = dist.new_group(backend="nccl_core")
    probe_sub = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    dist.all_reduce(probe_sub, group=group)
    tensors, works = queued_all_reduces(
        functools.partial(dist.all_reduce, group=group, async_op=True)
    )
    holder = {"group": group, "backend": group._get_backend(DEVICE)}
    del group

    def drop() -> None:
        dist.destroy_process_group(holder["group"])
        holder.clear()  # the last references: the group and its backend
        gc.collect()

    report = beside_spin(drop, "dropper", works)
    report["correct"] = all_summed(tensors) and bool((probe_sub == summed(1.0)).all())
    report["default_after"] = probe()
    dist.destroy_process_group()
    return report


def drop_backend_on_thread(job_store) -> dict:
    """A backend that no process group holds, made directly, dropped on a Python thread with
    async all_reduces queued: its destructor runs there, GIL held, and must let them finish."""
    torch.cuda.set_device(DEVICE)
    backend = torch_nccl_core._C.NcclCoreBackend(
        dist.PrefixStore("standalone/", job_store),
        RANK,
        WORLD,
        "standalone",
        torch_nccl_core.Options(),
        timedelta(seconds=30),
    )
    backend.communicator(DEVICE)  # collective: both ranks create it here
    first = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    backend.allreduce([first]).wait()
    tensors, works = queued_all_reduces(lambda t, b=backend: b.allreduce([t]))
    holder = [backend]
    del backend

    def drop() -> None:
        holder.clear()  # the last reference: ~NcclCoreBackend runs on this thread
        gc.collect()

    outcome = beside_spin(drop, "dropper", works)
    correct = all_summed(tensors) and bool((first == summed(1.0)).all())
    return {**outcome, "correct": correct}


def _nccl_memory_in_use() -> tuple[torch.Tensor, torch.Tensor]:
    """NCCL memory that a synchronous all_reduce (queued behind BUSY_S of GPU work) registered
    and reduced, and a copy of the result queued after it: (memory, copy)."""
    memory = torch_nccl_core.empty(NUMEL)
    memory.fill_(1.0 + RANK)
    gpu_busy(BUSY_S)
    dist.all_reduce(memory)
    for _ in range(3):  # more pending collectives on the group
        dist.all_reduce(torch.ones(NUMEL, device=DEVICE))
    return memory, memory.clone()


def free_nccl_memory_on_thread(job_store) -> dict:
    """The last reference to NCCL memory dropped on a Python thread while the GPU is busy and the
    main thread spins in Python: the free is stream-ordered (it waits for nothing), and the
    memory and its registration go once the GPU is done with them, at that thread's next
    NCCL-memory allocation."""
    init(job_store)
    probe()
    comm = torch_nccl_core.communicator()
    memory, copy = _nccl_memory_in_use()
    holder = [memory]
    del memory
    counts = {}

    def free() -> float:
        counts["before"] = comm._resource_count()
        start = time.monotonic()
        holder.clear()  # the last reference: NCCL memory freed on this thread
        gc.collect()
        seconds = time.monotonic() - start
        torch.cuda.synchronize(DEVICE)
        torch_nccl_core.empty(1, device=DEVICE)  # releases what this thread freed, now done
        return seconds

    report = beside_spin(free, "freer")
    report["free_s"] = report.pop("result")
    torch.cuda.synchronize(DEVICE)
    report["correct"] = bool((copy == summed(1.0)).all()) and probe()
    report["freed_on_thread"] = comm._resource_count() < counts.get("before", 0)
    dist.destroy_process_group()
    return report


def free_nccl_memory_beside_thread(job_store) -> dict:
    """The reverse: the last reference to NCCL memory dropped on the main thread, GPU busy, while
    another Python thread spins: the free waits for nothing, so no thread stalls for it."""
    init(job_store)
    probe()
    comm = torch_nccl_core.communicator()
    memory, copy = _nccl_memory_in_use()
    stop = threading.Event()
    spinner = Worker(lambda: spin_while(lambda: not stop.is_set()), "spinner")
    spinner.start()
    time.sleep(0.05)  # the spinner is running
    before = comm._resource_count()
    start = time.monotonic()
    del memory  # the last reference: NCCL memory freed on the main thread
    gc.collect()
    free_s = time.monotonic() - start
    time.sleep(0.05)
    stop.set()
    spinner.join(THREAD_LIMIT_S)
    torch.cuda.synchronize(DEVICE)
    report = {**spinner.report(), **(spinner.result or {}), "free_s": free_s}
    report["correct"] = bool((copy == summed(1.0)).all()) and probe()
    report["freed_on_main"] = comm._resource_count() < before
    dist.destroy_process_group()
    return report


TRAFFIC_ROUNDS = 300  # default-group all_reduces the main thread runs while the subgroup goes


def destroy_subgroup_on_thread_under_traffic(job_store) -> dict:
    """A Python thread destroys a subgroup (async all_reduces queued on it) with
    destroy_process_group(subgroup) while the main thread runs collectives on the default group,
    waiting for each tenth so that the traffic spans the teardown."""
    init(job_store)
    probe()
    group = dist.new_group(backend="nccl_core")
    tensors, works = queued_all_reduces(
        functools.partial(dist.all_reduce, group=group, async_op=True)
    )
    holder = [group]
    del group

    def destroy() -> None:
        dist.destroy_process_group(holder.pop())
        gc.collect()

    worker = Worker(destroy, "destroyer")
    worker.start()
    start = time.monotonic()
    outputs = []
    for i in range(TRAFFIC_ROUNDS):  # the same count on both ranks
        t = torch.full((1 << 16,), float(i) + RANK, device=DEVICE)
        dist.all_reduce(t)
        outputs.append(t)
        if i % 10 == 9:
            torch.cuda.current_stream().synchronize()
    traffic_s = time.monotonic() - start
    alive_after_traffic = worker.is_alive()
    worker.join(THREAD_LIMIT_S)
    del works
    torch.cuda.synchronize(DEVICE)
    report = {**worker.report(), "traffic_s": traffic_s}
    report["thread_alive_after_traffic"] = alive_after_traffic
    report["correct_subgroup"] = all_summed(tensors)
    report["correct_default"] = all_summed(outputs)
    report["default_after"] = probe()
    dist.destroy_process_group()
    return report


# --- Abort under a collective host call (the requirement 8) -----------------------------
#
# "Abort (timeout or user) while another thread is inside NCCL (window registration, split,
# device communicator creation, first use of staging memory) must not free the communicator under
# that thread: that call raises DistBackendError, nothing crashes." Rank 0's main thread enters a
# collective host call that rank 1 never joins; either a Python thread aborts the group's backend
# ABORT_AFTER_S later ("abort", the group's timeout far later), or nothing does and the group's
# timeout of SHORT_TIMEOUT_S must end the call ("timeout"). Rank 1 stays idle, with its
# communicator alive, until rank 0 has finished (or PEER_WAIT_S passed), then destroys.

ABORT_AFTER_S = 1.0
SHORT_TIMEOUT_S = 3.0  # "timeout" variants
LONG_TIMEOUT_S = 30.0  # "abort" variants: the timeout would end the call only much later
PEER_WAIT_S = 60.0  # how long rank 1 waits for rank 0; less than the test's child timeout

HostCall = tuple[Callable[[], object], object]  # (the lonely call, the backend to abort)


def world_backend():
    return dist.group.WORLD._get_backend(DEVICE)


def _init_then_time_out_after(job_store, timeout_s: float) -> None:
    """The default group, initialized under a long bound (at 4 ranks over sockets on a busy
    GPU, ncclCommInitRankConfig outlasted 3 s) and then given `timeout_s` for the call."""
    init(job_store, LONG_TIMEOUT_S)
    dist.group.WORLD.set_timeout(timedelta(seconds=timeout_s))


def _window_registration(job_store, timeout_s: float) -> HostCall | str:
    _init_then_time_out_after(job_store, timeout_s)
    if not torch_nccl_core.features()["window_registration"]:
        return "this NCCL has no window registration"
    comm = torch_nccl_core.communicator()
    if not comm.supports_windows:  # NCCL >= 2.29 gives None at once: no wait for the peer
        return comm._no_window_reason()
    memory = torch_nccl_core.empty(1 << 20)  # windows need NCCL memory
    return (lambda: comm.register_window(memory)), world_backend()


def _split(job_store, timeout_s: float) -> HostCall | str:
    _init_then_time_out_after(job_store, timeout_s)  # the parent's timeout bounds ncclCommSplit
    if not hasattr(dist, "split_group"):
        return "this torch has no split_group"
    return (
        lambda: dist.split_group(split_ranks=[[0, 1]], timeout=timedelta(seconds=timeout_s))
    ), world_backend()


def _first_use(job_store, timeout_s: float) -> HostCall | str:
    """new_group's communicator, created on first use (ncclCommInitRankConfig): the default
    group is left unbound, so that new_group does not create it at once on both ranks."""
    init(job_store, bind=False)
    torch.cuda.set_device(DEVICE)
    group = dist.new_group(backend="nccl_core", timeout=timedelta(seconds=timeout_s))
    backend = group._get_backend(DEVICE)
    return (lambda: backend.communicator(DEVICE)), backend


def _staging(job_store, timeout_s: float) -> HostCall | str:
    """The copy-engine reduce-scatter's first op makes its signal window and staging memory
    (collective window registrations) on the caller's thread."""
    init(job_store)
    group = dist.new_group(
        backend="nccl_core",
        timeout=timedelta(seconds=LONG_TIMEOUT_S),  # its creation is not the call under test
        pg_options=torch_nccl_core.Options(copy_engine_reduce_scatter=True),
    )
    comm = torch_nccl_core.communicator(group)
    group.set_timeout(timedelta(seconds=timeout_s))
    if comm.lsa_size != comm.size:
        return "the peers are not load/store reachable: no copy engine, no staging"
    output = torch.empty(1 << 16, device=DEVICE)
    source = torch.ones(WORLD << 16, device=DEVICE)
    backend = group._get_backend(DEVICE)
    return (lambda: dist.reduce_scatter_tensor(output, source, group=group)), backend


HOST_CALLS = {
    "window": _window_registration,
    "split": _split,
    "first_use": _first_use,
    "staging": _staging,
}


def _lonely_call(call: Callable[[], object], backend) -> dict:
    """Runs `call` on this thread; with `backend`, a Python thread aborts it ABORT_AFTER_S in."""
    stamps = {}

    def abort_later() -> None:
        time.sleep(ABORT_AFTER_S)
        stamps["abort_at"] = time.monotonic()
        backend.abort()
        stamps["abort_returned_at"] = time.monotonic()

    aborter = threading.Thread(target=abort_later, name="aborter", daemon=True)
    start = time.monotonic()
    if backend is not None:
        aborter.start()
    error = None
    try:
        call()
    except Exception as e:  # reported to the parent
        error = e
    ended = time.monotonic()
    report = {"outcome": "raised" if error is not None else "returned", "elapsed_s": ended - start}
    if error is not None:
        report["error_type"] = type(error).__name__
        report["error"] = str(error)[:1500]
        report["is_dist_backend_error"] = isinstance(error, dist.DistBackendError)
    if backend is not None:
        aborter.join(10.0)
        abort_at = stamps.get("abort_at")
        report["abort_thread_done"] = not aborter.is_alive()
        report["ended_before_abort"] = abort_at is None or ended < abort_at
        report["latency_s"] = None if abort_at is None else ended - abort_at
        if "abort_returned_at" in stamps:
            report["abort_call_s"] = stamps["abort_returned_at"] - abort_at
    return report


def abort_during_host_call(job_store, call: str, how: str) -> dict:
    """Rank 0 is inside a collective host call that rank 1 never joins when the group is aborted
    (by a Python thread, or by its timeout): the call raises DistBackendError, nothing crashes,
    destroy returns. "abort_blocking": a blocking communicator, which only NCCL's abort flag
    (ncclCommRevoke) gets out of its bootstrap wait; only nonblocking ones time out."""
    timeout_s = SHORT_TIMEOUT_S if how == "timeout" else LONG_TIMEOUT_S
    report: dict = {"call": call, "how": how, "timeout_s": timeout_s}
    if how != "abort_blocking":
        os.environ["TORCH_NCCL_USE_COMM_NONBLOCKING"] = "1"
    setup = HOST_CALLS[call](job_store, timeout_s)
    if isinstance(setup, str):
        report["skipped"] = setup
    else:
        lonely, backend = setup
        meet(job_store, "ready")  # rank 1 is idle from here on
        if RANK == 0:
            report.update(_lonely_call(lonely, None if how == "timeout" else backend))
        else:
            # Not joining: rank 1's communicator stays alive until rank 0 is done, so that only
            # the abort (or the timeout) can end rank 0's call.
            try:
                job_store.wait(["rank0_done"], timedelta(seconds=PEER_WAIT_S))
                report["peer_done"] = True
            except Exception as e:  # rank 0 hung (a timeout) or crashed (its store is gone)
                report["peer_done"] = False
                report["peer_error"] = f"{type(e).__name__}: {e}"
        del setup, lonely, backend
    start = time.monotonic()
    dist.destroy_process_group()
    gc.collect()
    report["destroy_returned"] = True
    report["destroy_s"] = time.monotonic() - start
    if RANK == 0:
        job_store.set("rank0_done", "1")
    report["exit_met"] = meet(job_store, "exit", 30.0)  # rank 0's store outlives rank 1's use
    return report


# --- Faults as ranks on other nodes (or sharing a GPU) meet them --------------------------------

CHURN_TIMEOUT_S = 12.0
CHURN_ITERATIONS = 300


def nccl_memory_churn_on_two_threads(job_store) -> dict:
    """Two Python threads, each with a group of the same two ranks and a stream of its own; each
    iteration reduces a new NCCL-memory tensor that is freed right after, with random per-rank
    skew. Was: each free synchronized the whole device, so it waited for the other thread's
    collective, whose peer waited in the same way for this thread's next op: both groups ended
    in a false "collective operation timeout".

    The threads' kernels are loaded before they run. CUDA loads a kernel at its first launch
    (lazy loading, torch's default), and that load may wait for the kernels running on the
    device (CUDA Programming Guide, "Lazy Loading", "Potential Hazards"): a thread's first add_
    then waits for the other thread's all_reduce, whose peer waits for this thread's next op.
    The built-in `nccl` stalls the same way on this loop (measured on one H100: 3 of 11 runs,
    each in the first iteration, one thread in fill_ and one in add_ on each rank; 7 of 7 ran
    through with the kernels loaded first or CUDA_MODULE_LOADING=EAGER): not a fault of the
    backend's, and what this scenario checks is its frees and allocations."""
    init(job_store)
    groups = [
        dist.new_group(backend="nccl_core", timeout=timedelta(seconds=CHURN_TIMEOUT_S))
        for _ in range(2)
    ]
    for group in groups:  # communicators made in step, before the threads run
        dist.all_reduce(torch.ones(1, device=DEVICE), group=group)
    warm = torch.zeros(1 << 14, device=DEVICE, dtype=torch.float64)
    warm.add_(torch_nccl_core.empty(1 << 14, device=DEVICE).fill_(1.0))
    bool((warm == 1.0).all())  # the threads' final check, on a thread that may finish first
    torch.cuda.synchronize(DEVICE)
    outcomes: list[dict] = [{}, {}]

    def churn(index: int) -> None:
        rng = random.Random(1000 * RANK + index)
        stream = torch.cuda.Stream(DEVICE)
        try:
            with torch.cuda.stream(stream):
                total = torch.zeros(1 << 14, device=DEVICE, dtype=torch.float64)
                for i in range(CHURN_ITERATIONS):
                    time.sleep(rng.random() * 0.002)
                    t = torch_nccl_core.empty(1 << 14, device=DEVICE).fill_(1.0 + RANK + i % 7)
                    dist.all_reduce(t, group=groups[index])
                    total.add_(t)
                    del t  # freed with its all_reduce just enqueued, the host not waiting
            stream.synchronize()
            expected = sum(summed(1.0 + i % 7) for i in range(CHURN_ITERATIONS))
            outcomes[index] = {"correct": bool((total == expected).all())}
        except Exception as e:  # reported to the parent
            outcomes[index] = {"error": f"{type(e).__name__}: {e}"[:1500]}

    start = time.monotonic()
    threads = [threading.Thread(target=churn, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CHURN_TIMEOUT_S * 4)
    report = {
        "elapsed_s": time.monotonic() - start,
        "threads_done": not any(thread.is_alive() for thread in threads),
        "outcomes": outcomes,
    }
    dist.destroy_process_group()
    return report


def outlive_a_killed_peer(job_store, timeout_s: float = 10.0) -> dict:
    """The last rank enqueues an all_reduce and SIGKILLs itself; every other rank reports the
    DistBackendError its next ops raised (None if none came) and after how long."""
    init(job_store, timeout_s)
    probe()
    torch.cuda.synchronize(DEVICE)
    meet(job_store, "ready")
    big = torch.ones(NUMEL, device=DEVICE)
    if RANK == WORLD - 1:
        dist.all_reduce(big)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    report: dict = {"timeout_s": timeout_s}
    try:
        for _ in range(4):  # the first one pairs with the victim's
            dist.all_reduce(big)
        torch.cuda.synchronize(DEVICE)
        while time.monotonic() - start < timeout_s + 10.0:
            probe()
            time.sleep(0.05)
        report["error"] = None
    except dist.DistBackendError as e:
        report["error"] = str(e)[:2000]
    report["error_s"] = time.monotonic() - start
    return report


def peer_killed_mid_all_reduce(job_store) -> dict:
    """Rank 1 enqueues an all_reduce and SIGKILLs itself: rank 0's DistBackendError names the
    op, its sequence number and the group (NCCL's own words say what happened)."""
    report = outlive_a_killed_peer(job_store)
    start = time.monotonic()
    dist.destroy_process_group()
    report["destroy_s"] = time.monotonic() - start
    return report


def clean_teardown(job_store, first: int) -> dict:
    """A correct run: ops, then rank `first` destroys its group (closing its connections) while
    the other stays idle for 2 s (its watchdog polls meanwhile), then destroys too. Nothing may
    be logged: the parent reads both ranks' stderr."""
    init(job_store)
    correct = all(probe() for _ in range(5))
    torch.cuda.synchronize(DEVICE)
    meet(job_store, "ops_done")
    if RANK == first:
        dist.destroy_process_group()
        job_store.set("first_destroyed", "1")
    else:
        job_store.wait(["first_destroyed"], timedelta(seconds=60))
        time.sleep(2.0)
        dist.destroy_process_group()
    meet(job_store, "both_destroyed")  # the store's host (rank 0) outlives rank 1's use of it
    return {"correct": correct}


def ddp_difference_from_a_reference(steps: int = 5) -> float:
    """Trains a small model under DDP over the default group, each rank on batches of its own,
    and the same model in this process on every rank's batches (DDP averages the ranks'
    gradients: the mean of their losses has that gradient); the largest parameter difference."""
    from torch.nn.parallel import DistributedDataParallel

    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8).to(DEVICE)
    reference = torch.nn.Linear(32, 8).to(DEVICE)
    reference.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model, device_ids=[DEVICE.index])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

    def batch(step: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(1000 * step + r)
        x, y = torch.randn(16, 32, generator=generator), torch.randn(16, 8, generator=generator)
        return x.to(DEVICE), y.to(DEVICE)

    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        losses = [
            torch.nn.functional.mse_loss(reference(x), y)
            for x, y in (batch(step, r) for r in range(world))
        ]
        (sum(losses) / world).backward()
        reference_optimizer.step()
    torch.cuda.synchronize(DEVICE)
    return max(
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )


def killed_rank_then_shrink_and_train(job_store) -> dict:
    """The last rank SIGKILLs itself mid all_reduce: every other rank raises DistBackendError
    naming the op, its sequence number and the group within the timeout, shrinks the default
    group to the survivors with SHRINK_ABORT, and trains a small DDP model there whose
    parameters match a reference trained on the survivors' batches."""
    victim = WORLD - 1
    report = outlive_a_killed_peer(job_store)
    start = time.monotonic()
    dist.shrink_group([victim], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    report["shrink_s"] = time.monotonic() - start
    report["world"] = dist.get_world_size()
    report["probe"] = probe()
    report["ddp_difference"] = ddp_difference_from_a_reference()
    dist.destroy_process_group()
    return report


GROW_KEY = "regrow-after-kill"


def killed_rank_then_shrink_grow_and_train(job_store) -> dict:
    """As killed_rank_then_shrink_and_train, then a process that replaced the killed rank
    (replacement_joins_the_grown_world) joins: the world grows back to its size, ranks keep
    their numbers, and a DDP model trained on it matches a reference of every rank's batches.
    Where NCCL cannot grow (< 2.29), grow_group must refuse naming what it needs, and the
    shrunk world go on."""
    report = outlive_a_killed_peer(job_store)
    dist.shrink_group([WORLD - 1], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    report["shrunk_world"] = dist.get_world_size()
    if not torch_nccl_core.features()["comm_grow"]:
        try:
            torch_nccl_core.grow_group(WORLD, GROW_KEY)
            report["refusal"] = None
        except NotImplementedError as e:
            report["refusal"] = str(e)
        report["probe"] = probe()
        dist.destroy_process_group()
        return report
    # As an elastic agent would: the new process is up before the world waits for it (the
    # grow's meeting is bounded by the world's 10 s timeout, a Python start is not).
    job_store.wait(["replacement_up"], timedelta(seconds=60))
    start = time.monotonic()
    world = torch_nccl_core.grow_group(WORLD, GROW_KEY)
    report["grow_s"] = time.monotonic() - start
    report.update(grown_world_report(world))
    return report


def replacement_joins_the_grown_world(job_store) -> dict:
    """A new process in place of the killed last rank: joins the survivors' grow as that rank."""
    torch.cuda.set_device(DEVICE)
    torch.cuda.synchronize(DEVICE)  # CUDA is up
    job_store.set("replacement_up", "1")
    world = torch_nccl_core.join_group(
        WORLD, RANK, GROW_KEY, store=job_store, timeout=timedelta(seconds=60), device_id=DEVICE
    )
    return grown_world_report(world)


def grown_world_report(world: dist.ProcessGroup) -> dict:
    report = {
        "default": world is dist.group.WORLD,
        "world": dist.get_world_size(),
        "rank": dist.get_rank(),
        "backend": dist.get_backend(),
        "probe": probe(),
        "ddp_difference": ddp_difference_from_a_reference(),
    }
    dist.destroy_process_group()
    return report


def rank0_late_at_init(job_store) -> dict:
    """Rank 0 (the store's host) comes to init_process_group 5 s after the others: every rank
    initializes, the first op is right, nothing fails."""
    meet(job_store, "started")
    if RANK == 0:
        time.sleep(5.0)
    start = time.monotonic()
    init(job_store, timeout_s=30.0, meet_first=False)
    report = {"init_s": time.monotonic() - start, "correct": probe()}
    dist.destroy_process_group()
    return report


def rank_never_joins_new_group(job_store) -> dict:
    """The last rank never calls new_group; on the others, the group's first use raises
    DistBackendError naming that rank once the group's 3 s timeout passed, and the default
    group goes on working on every rank."""
    init(job_store, timeout_s=30.0)
    probe()
    absent = WORLD - 1
    report: dict = {}
    if RANK != absent:
        start = time.monotonic()
        try:
            group = dist.new_group(list(range(WORLD)), timeout=timedelta(seconds=3.0))
            t = torch.ones(16, device=DEVICE)
            dist.all_reduce(t, group=group)
            torch.cuda.synchronize(DEVICE)
            report["error"] = None
        except dist.DistBackendError as e:
            report["error"] = str(e)
        report["error_s"] = time.monotonic() - start
    meet(job_store, "past_new_group")
    report["default_group_works"] = probe()
    dist.destroy_process_group()
    return report


def use_a_window_first() -> None:
    """A window made, a one-sided put refused where the peers cannot be reached that way (other
    nodes, NCCL < 2.29), the window freed: as the soak's one-sided op does."""
    window = torch_nccl_core.empty(1024, window=True)
    window.fill_(-1.0)
    torch.cuda.synchronize(DEVICE)
    dist.barrier()
    from torch_nccl_core import ops as one_sided

    comm = torch_nccl_core.communicator()
    if comm.lsa_size != comm.size and torch_nccl_core.one_sided_engine() != "nccl":
        try:
            one_sided.put_signal(torch.ones(1024, device=DEVICE), window, 1 - RANK)
        except NotImplementedError:
            pass
    del window
    gc.collect()


def use_a_graph_first() -> None:
    """A CUDA graph that captured an all_reduce, replayed, then destroyed (the soak's graph op)."""
    static = torch.ones(255, device=DEVICE)  # alive while the graph that uses it is
    graph = all_reduce_graph(static)
    graph.replay()
    torch.cuda.synchronize(DEVICE)
    del graph


def timeout_after(job_store, first: Callable[[], None]) -> dict:
    """`first`, then rank 1 skips an all_reduce: rank 0's times out and the watchdog aborts the
    communicator with that kernel in flight. CUDA must stay healthy on both ranks: an abort that
    freed memory a kernel still used would fault (under MPS, in every rank's process)."""
    init(job_store, timeout_s=3.0)
    probe()
    first()
    dist.barrier()
    torch.cuda.synchronize(DEVICE)
    report: dict = {"error": None}
    if RANK == 0:
        t = torch.ones(16, device=DEVICE)
        try:
            dist.all_reduce(t)
            torch.cuda.synchronize(DEVICE)
            dist.all_reduce(t)
        except dist.DistBackendError as e:
            report["error"] = str(e)
    meet(job_store, "timed_out")
    try:
        doubled = torch.full((8,), 2.0, device=DEVICE) * 2
        torch.cuda.synchronize(DEVICE)
        report["cuda_ok"] = bool((doubled == 4.0).all())
    except Exception as e:  # reported to the parent
        report["cuda_ok"] = repr(e)
    dist.destroy_process_group()
    return report


SCENARIOS = {
    "nccl_memory_churn_on_two_threads": nccl_memory_churn_on_two_threads,
    "peer_killed_mid_all_reduce": peer_killed_mid_all_reduce,
    "killed_rank_then_shrink_and_train": killed_rank_then_shrink_and_train,
    "killed_rank_then_shrink_grow_and_train": killed_rank_then_shrink_grow_and_train,
    "replacement_joins_the_grown_world": replacement_joins_the_grown_world,
    "rank0_late_at_init": rank0_late_at_init,
    "rank_never_joins_new_group": rank_never_joins_new_group,
    "timeout_after_a_window": lambda s: timeout_after(s, use_a_window_first),
    "timeout_after_a_graph": lambda s: timeout_after(s, use_a_graph_first),
    "clean_teardown_rank0_first": lambda s: clean_teardown(s, 0),
    "clean_teardown_rank1_first": lambda s: clean_teardown(s, 1),
    "destroy_after_sync_ops": destroy_after_sync_ops,
    "host_ahead_of_gpu": host_ahead_of_gpu,
    "capture_after_eager": capture_after_eager,
    "destroy_with_live_graph": lambda s: teardown_with_live_graph(s, "destroy"),
    "abort_with_live_graph": lambda s: teardown_with_live_graph(s, "abort"),
    "exit_with_live_graph": lambda s: teardown_with_live_graph(s, "exit"),
    "reinit_after_failure": reinit_after_failure,
    "shrink_past_a_silent_rank": shrink_past_a_silent_rank,
    "one_shot_peer_silent": one_shot_peer_silent,
    "flight_recorder_names_a_skipped_collective": flight_recorder_names_a_skipped_collective,
    "watchdog_frees_nothing": watchdog_frees_nothing,
    "no_set_device": no_set_device,
    "concurrent_first_use": concurrent_first_use,
    "destroy_world_on_thread": destroy_world_on_thread,
    "drop_subgroup_on_thread": drop_subgroup_on_thread,
    "drop_backend_on_thread": drop_backend_on_thread,
    "free_nccl_memory_on_thread": free_nccl_memory_on_thread,
    "free_nccl_memory_beside_thread": free_nccl_memory_beside_thread,
    "destroy_subgroup_on_thread_under_traffic": destroy_subgroup_on_thread_under_traffic,
}
SCENARIOS.update(
    {
        f"{how}_during_{call}": functools.partial(abort_during_host_call, call=call, how=how)
        for call in HOST_CALLS
        for how in ("abort", "timeout", "abort_blocking")
        if how != "abort_blocking" or call in ("window", "split")
    }
)

if __name__ == "__main__":
    report = SCENARIOS[sys.argv[1]](store())
    print(json.dumps(report), flush=True)

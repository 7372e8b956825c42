"""One rank of a two-process world that runs one failure-semantics scenario, then prints a JSON
line of what it saw. The parent test asserts on it, and on this process ending in time with exit
code 0: a hang or crash is the failure being looked for.

Started by test_failure_semantics.py, one process per rank, with RANK / WORLD_SIZE / MASTER_ADDR
/ MASTER_PORT set. Scenarios set and bind cuda:RANK, except those that show what happens when a
program does neither.
"""

import gc
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_nccl_core

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEVICE = torch.device("cuda", RANK)
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


def init(job_store, timeout_s: float = 30.0, bind: bool = True) -> None:
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


def summed(value: float) -> float:
    """What an all_reduce of `value + rank` over the world gives."""
    return sum(value + r for r in range(WORLD))


def probe() -> bool:
    """One all_reduce; whether it gave the right sum."""
    t = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    dist.all_reduce(t)
    return bool((t == summed(1.0)).all())


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


def teardown_with_live_graph(job_store, how: str) -> dict:
    """destroy / abort / interpreter exit while a graph that captured the group is alive."""
    init(job_store)
    static = torch.full((1024,), 1.0 + RANK, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
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
    if RANK == 0:
        time.sleep(3.0)
    init(job_store, timeout_s=10.0)
    after_late = probe()
    dist.destroy_process_group()
    return {
        "first": first,
        "rank0_failure": failed,
        "after_failure": after_failure,
        "after_late": after_late,
    }


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


SCENARIOS = {
    "destroy_after_sync_ops": destroy_after_sync_ops,
    "host_ahead_of_gpu": host_ahead_of_gpu,
    "capture_after_eager": capture_after_eager,
    "destroy_with_live_graph": lambda s: teardown_with_live_graph(s, "destroy"),
    "abort_with_live_graph": lambda s: teardown_with_live_graph(s, "abort"),
    "exit_with_live_graph": lambda s: teardown_with_live_graph(s, "exit"),
    "reinit_after_failure": reinit_after_failure,
    "watchdog_frees_nothing": watchdog_frees_nothing,
    "no_set_device": no_set_device,
}

if __name__ == "__main__":
    report = SCENARIOS[sys.argv[1]](store())
    print(json.dumps(report), flush=True)

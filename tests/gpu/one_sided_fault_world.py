"""One rank of a two-process world that runs one one-sided fault scenario, then prints a JSON line
of what it saw (before tearing down, so that a teardown that hangs still leaves the report). The
parent test asserts on the report and on this process ending in time with exit code 0.

Started by test_one_sided_faults.py, one process per rank, with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set, as

    one_sided_fault_world.py SCENARIO ENGINE API

ENGINE is "nccl" or "load_store" (TORCH_NCCL_CORE_ONE_SIDED_ENGINE, read at the first one-sided
op, so set here before anything runs); API is "method" (Communicator methods) or "op"
(torch.ops.nccl_core through torch_nccl_core.ops).
"""

import json
import os
import sys
import time
from datetime import timedelta

SCENARIO, ENGINE, API = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["TORCH_NCCL_CORE_ONE_SIDED_ENGINE"] = ENGINE

import fault_world  # noqa: E402  (this file's folder is on sys.path)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from fault_world import store  # noqa: E402

import torch_nccl_core  # noqa: E402
from torch_nccl_core import WaitSignalDesc, ops  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
PEER = 1 - RANK
DEVICE = fault_world.DEVICE
TIMEOUT_S = 3.0  # the scenario group's; test_one_sided_faults.py reads it from the report
NUMEL = 1024
# Kept until exit: freeing NCCL memory waits for the device, which must not happen before the
# report is printed (a stream may be stuck).
KEEP = []


def init(job_store, timeout_s: float) -> dist.ProcessGroup:
    """The default group, and a group of the scenario's own (it may be aborted)."""
    fault_world.init(job_store, timeout_s=60.0)
    return dist.new_group(backend="nccl_core", timeout=timedelta(seconds=timeout_s))


def put_signal(comm, window, win, src, peer, offset, group) -> None:
    if API == "method":
        comm.put_signal(src, peer, win, offset=offset)
    else:
        ops.put_signal(src, window, peer, offset, group=group)


def signal(comm, window, peer, group) -> None:
    if API == "method":
        comm.signal(peer)
    else:
        ops.signal(window, peer, group=group)


def wait_signal(comm, window, peer, count, group) -> None:
    if API == "method":
        comm.wait_signal(WaitSignalDesc(peer, op_count=count))
    else:
        ops.wait_signal(window, peer, count, group=group)


def error_text(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def drained(deadline: float, report: dict) -> float | None:
    """Seconds until the current stream finished its work, or None if it had not by `deadline`
    (or CUDA failed: then report["cuda_error"] says how). Polled, not synchronized: a stream
    that never drains must not hang the report."""
    start = time.monotonic()
    stream = torch.cuda.current_stream()
    try:
        while not stream.query():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
    except Exception as e:  # a wait left on freed memory may fault the context
        report["cuda_error"] = error_text(e)
        return None
    return time.monotonic() - start


def wait_never_signalled(job_store) -> dict:
    """Rank 0 waits for a signal rank 1 never sends: the group's watchdog fails the group at its
    timeout, naming wait_signal, the peer and the group; the waiting stream is released."""
    group = init(job_store, TIMEOUT_S)
    comm = torch_nccl_core.communicator(group)
    if not comm.supports_windows:
        return {"unavailable": comm._no_window_reason()}
    window = torch_nccl_core.empty(NUMEL, window=True, group=group)
    win = comm.find_window(window)  # found now: the abort closes it
    src = torch.ones(16, device=DEVICE)
    KEEP.extend([window, comm, win, src])
    report = {"group": group.group_name, "timeout_s": TIMEOUT_S}
    # A healthy exchange first: the engine works, and the wait below is not the group's first op.
    try:
        signal(comm, window, PEER, group)
        wait_signal(comm, window, PEER, 1, group)
    except NotImplementedError as e:  # the same on both ranks
        report["unavailable"] = str(e)
    torch.cuda.synchronize()
    dist.barrier(group=group)
    if "unavailable" in report:
        return report
    report["engine"] = torch_nccl_core.one_sided_engine()
    if RANK == 0:
        start = time.monotonic()
        wait_signal(comm, window, PEER, 1, group)  # rank 1 never signals
        report["enqueue_s"] = time.monotonic() - start
        deadline = start + TIMEOUT_S + 30.0
        while not comm.is_aborted and time.monotonic() < deadline:
            time.sleep(0.01)
        error = None
        try:  # the next one-sided op raises the group's failure
            signal(comm, window, PEER, group)
        except Exception as e:  # reported to the parent
            error = e
        report["error_s"] = time.monotonic() - start
        report["error"] = error_text(error)
        report["dist_backend_error"] = isinstance(error, dist.DistBackendError)
        report["aborted"] = comm.is_aborted
        # The waiting kernel (load_store) or NCCL's wait (nccl) ends with the abort.
        report["drained_s"] = drained(deadline, report)
        collective = None
        if comm.is_aborted:
            try:
                dist.all_reduce(src, group=group)
            except Exception as e:  # reported to the parent
                collective = e
        report["all_reduce_error"] = error_text(collective)
        put = None
        try:
            put_signal(comm, window, win, src, PEER, 0, group)
        except Exception as e:  # reported to the parent
            put = e
        report["put_signal_error"] = error_text(put)
    return report


def asymmetric_windows(job_store) -> dict:
    """Rank 0 registers a window of 4 * NUMEL floats, rank 1 one of 2 * NUMEL. A put that fits
    rank 0's own window but not rank 1's is refused before NCCL is called; a put that does not
    fit rank 1's own window but fits rank 0's is carried out."""
    group = init(job_store, 30.0)
    comm = torch_nccl_core.communicator(group)
    if not comm.supports_windows:
        return {"unavailable": comm._no_window_reason()}
    window = torch_nccl_core.empty((4 if RANK == 0 else 2) * NUMEL, window=True, group=group)
    window.zero_()
    win = comm.find_window(window)
    src = torch.full((NUMEL,), float(RANK + 1), device=DEVICE)
    KEEP.extend([window, comm, win, src])
    torch.cuda.synchronize()
    dist.barrier(group=group)
    report = {"window_bytes": win.size, "engine": torch_nccl_core.one_sided_engine()}
    refused, failed = None, None
    try:
        if RANK == 0:
            try:  # fits here (4 * NUMEL), not at rank 1 (2 * NUMEL): nothing may reach rank 1
                put_signal(comm, window, win, src, 1, 2 * NUMEL, group)
            except ValueError as e:
                refused = e
            put_signal(comm, window, win, src, 1, NUMEL, group)  # rank 1's [NUMEL, 2 * NUMEL)
        else:  # beyond this rank's window, inside rank 0's [3 * NUMEL, 4 * NUMEL)
            put_signal(comm, window, win, src, 0, 3 * NUMEL, group)
        wait_signal(comm, window, PEER, 1, group)
    except NotImplementedError as e:  # the same on both ranks
        report["unavailable"] = str(e)
    except Exception as e:  # reported to the parent; the peer's wait then runs out
        failed = e
    report["refused"] = error_text(refused)
    report["failed"] = error_text(failed)
    report["drained_s"] = drained(time.monotonic() + 30.0, report)
    if report["drained_s"] is not None:
        contents = window.cpu()
        if RANK == 0:
            expected = torch.zeros(4 * NUMEL)
            expected[3 * NUMEL :] = 2.0
        else:
            expected = torch.zeros(2 * NUMEL)
            expected[NUMEL:] = 1.0
        report["correct"] = bool(torch.equal(contents, expected))
    return report


SCENARIOS = {
    "wait_never_signalled": wait_never_signalled,
    "asymmetric_windows": asymmetric_windows,
}

if __name__ == "__main__":
    if ENGINE == "nccl" and not torch_nccl_core.features().get("host_one_sided", False):
        print(json.dumps({"unavailable": "NCCL's host one-sided API needs NCCL >= 2.29"}))
        sys.exit(0)
    job_store = store()
    report = SCENARIOS[SCENARIO](job_store)
    print(json.dumps(report), flush=True)
    # Both ranks tear down once both reported; through the store, since a stream may be stuck.
    job_store.set(f"reported_{RANK}", "1")
    job_store.wait([f"reported_{r}" for r in range(WORLD)], timedelta(seconds=60))
    dist.destroy_process_group()

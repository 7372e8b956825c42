"""Failure semantics as programs meet them: destroy right after sync ops, the host far ahead of
the GPU, a capture right after eager traffic, teardown with live CUDA graphs, re-init in the same
process, the watchdog never blocking, no set_device, teardown and frees on Python threads, and an
abort while a thread is inside a collective NCCL host call. Each scenario runs in a two-process
world of its own (fault_world.py), observed from here: a hang or crash is the failure being
looked for.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest
import torch.distributed as dist

import torch_nccl_core

from .helpers import needs_ranks, run_child_world, window_refusal

# Each scenario scripts the parts of two ranks (which one dies, which one goes quiet): it runs
# in a world of the suite's first two ranks; the others wait for it.
pytestmark = needs_ranks(2)

SCRIPT = pathlib.Path(__file__).resolve().parent / "fault_world.py"
SLACK_S = 2.0  # what the issue allows past the timeout: watchdog polling and the abort
# A shorter bound on each child, for runs against code where the scenarios hang.
CHILD_TIMEOUT_CAP_S = float(os.environ.get("NCCL_CORE_TEST_CHILD_TIMEOUT_S", "inf"))


def scenario(rank: int, name: str, timeout_s: float = 90.0, world: int = 2) -> dict:
    """Runs scenario `name` on the first `world` ranks; this rank's report, once its child
    exited with 0."""
    child = run_child_world(rank, SCRIPT, [name], min(timeout_s, CHILD_TIMEOUT_CAP_S), world=world)
    if child is None:
        pytest.skip(f"a {world}-rank scenario: it ran on ranks 0 to {world - 1}")
    assert child.returncode == 0, (
        f"{name}: rc {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-12000:]}"
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(150, method="thread")
def test_concurrent_first_use_makes_one_communicator(rank):
    """Was: two threads of rank 0 both made the communicator of a group without a device; one
    returned, the other and rank 1 hung in the rendezvous."""
    report = scenario(rank, "concurrent_first_use", timeout_s=90.0)
    if rank == 0:
        assert all(t["thread_done"] and t["error"] is None for t in report["threads"]), report
        first, second = report["results"]
        assert first == second and first[0] == 2, report
    assert report["correct"], report


@pytest.mark.timeout(150, method="thread")
def test_destroy_lets_synchronous_ops_finish(rank):
    """Was: destroy aborted the communicator under sync ops still queued, results wrong."""
    assert scenario(rank, "destroy_after_sync_ops")["correct"]


@pytest.mark.timeout(150, method="thread")
def test_healthy_queue_deeper_than_the_timeout_is_not_aborted(rank):
    """Was: one shared tail event never completed while the host stayed ahead: abort at 3 s."""
    report = scenario(rank, "host_ahead_of_gpu")
    assert report["error"] is None, report["error"]
    assert report["correct"]
    assert report["iterations"] > 100


@pytest.mark.timeout(150, method="thread")
def test_capture_in_every_mode_right_after_eager_ops(rank):
    """Was: the watchdog's event query invalidated a global-mode capture and aborted the group."""
    report = scenario(rank, "capture_after_eager")
    for mode, outcome in report.items():
        assert outcome == {"replays_correct": True, "eager_after": True}, (mode, outcome)


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("how", ["destroy", "abort", "exit"])
def test_teardown_with_a_live_graph_returns(rank, how):
    """Was: NCCL's abort waits for every graph that captured the communicator: a hang."""
    report = scenario(rank, f"{how}_with_live_graph", timeout_s=60.0)
    assert report["replayed"]
    assert report["teardown_s"] < 10.0, report
    assert report.get("replay_after_s", 0.0) < 10.0, report


@pytest.mark.timeout(150, method="thread")
def test_reinit_after_a_failure_and_with_a_late_rank(rank):
    """Was: the new group read the old abort marker (aborted itself) or the old unique id (hang)."""
    report = scenario(rank, "reinit_after_failure", timeout_s=120.0)
    assert report["first"]
    if rank == 0:
        assert re.search(r"allreduce \(seq \d+\)", report["rank0_failure"] or ""), report
    assert report["after_failure"], report
    assert report["after_late"], report


@pytest.mark.timeout(150, method="thread")
def test_one_shot_all_reduce_with_a_silent_peer_fails_and_tears_down(rank):
    """The one-shot kernel's wait for its peers ends when the watchdog aborts the communicator:
    the op fails as a DistBackendError naming it, and destroy returns. A wait that does not
    look at the abort flag spins on the GPU for ever and the child times out."""
    report = scenario(rank, "one_shot_peer_silent", timeout_s=120.0)
    if not report["lsa"]:
        pytest.skip("the two ranks do not map each other's memory: no one-shot kernel")
    assert report["first"], report
    if rank == 0:
        assert re.search(r"allreduce \(seq \d+\)", report["rank0_failure"] or ""), report
        assert report["failed_after_s"] < 3.0 + SLACK_S, report
    assert report["destroy_s"] < 10.0, report


@pytest.mark.timeout(150, method="thread")
def test_shrink_with_abort_goes_on_without_a_silent_rank(rank):
    report = scenario(rank, "shrink_past_a_silent_rank")
    assert report["first"]
    if rank == 0:
        assert report["shrink_s"] < 10.0, report  # not the 60 s timeout
        assert "SHRINK_ABORT" in report["hung_op"], report
        assert report["world"] == 1 and report["after"], report
        assert report["destroy_s"] < 5.0, report


@pytest.mark.timeout(150, method="thread")
@pytest.mark.skipif(
    not torch_nccl_core._C.flight_recorder_enabled(),
    reason="this torch records nccl_core groups in its own flight recorder",
)
def test_flight_recorder_dump_names_the_skipped_collective_and_rank(rank):
    world = dist.get_world_size()
    report = scenario(rank, "flight_recorder_names_a_skipped_collective", world=world)
    assert report["dumped"] == [True] * world, report
    if rank != 1:
        # The first rank to time out aborts: the others may see that before their own deadline.
        assert re.search("timeout|asynchronous error", report["error"] or ""), report
    if rank == 0:  # the analyzer runs there
        assert report["flagged"] == [[5, [1]]], report  # JSON: (seq, missing ranks)


@pytest.mark.timeout(150, method="thread")
def test_watchdog_never_frees_nccl_memory(rank):
    """Was: the watchdog freed NCCL memory (a device-wide wait) behind a hung op: no abort."""
    report = scenario(rank, "watchdog_frees_nothing", timeout_s=120.0)
    if rank == 0:
        assert report["error"] is not None and "DistBackendError" in report["error"], report
        assert report["elapsed_s"] <= 5.0 + SLACK_S, report
    assert report["destroy_s"] < 10.0, report


@pytest.mark.timeout(150, method="thread")
def test_no_set_device_uses_rank_devices(rank):
    """Was: a barrier before any op put both ranks on cuda:0 ("Duplicate GPU detected")."""
    report = scenario(rank, "no_set_device")
    assert report["correct"]
    assert report["current_device"] == 0  # the program's current device was left alone


# --- Teardown and frees on other threads ------------------------------------------------------
# The scenarios keep the GPU busy for 1.5 s (fault_world.BUSY_S) ahead of the queued work.
THREAD_FEW_S = 10.0  # "within a few seconds": a worker's teardown, the GPU's 1.5 s included
GIL_STALL_S = 0.5  # a spinning thread never stalls this long (the device wait is ~1.5 s)
DEVICE_WAIT_S = 0.5  # a free that waited for the busy device took longer than this


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize(
    "name", ["destroy_world_on_thread", "drop_subgroup_on_thread", "drop_backend_on_thread"]
)
def test_backend_dropped_on_a_python_thread_with_work_pending(rank, name):
    """The last reference to a group / backend goes on a threading.Thread, async all_reduces
    still queued, the main thread spinning in Python: no deadlock, the ops finish right."""
    report = scenario(rank, name, timeout_s=60.0)
    assert report["thread_done"] and report["error"] is None, report
    assert report["thread_s"] < THREAD_FEW_S, report
    assert report["correct"], report
    assert report.get("default_after", True), report


FREES = {  # where NCCL memory is freed -> the scenario
    "thread": "free_nccl_memory_on_thread",
    "main": "free_nccl_memory_beside_thread",
}


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("where", list(FREES))
def test_nccl_memory_freed_beside_a_spinning_thread_stalls_no_thread(rank, where):
    """Was: the free synchronized the whole device (a wait another group's peers could make
    endless). It is stream-ordered: it returns at once although the GPU is busy (on a worker
    thread, or on the main thread while another spins in Python), and the memory and its
    registration go once the GPU is done."""
    report = scenario(rank, FREES[where], timeout_s=60.0)
    assert report["thread_done"] and report["error"] is None, report
    assert report[f"freed_on_{where}"], report
    assert report["free_s"] < DEVICE_WAIT_S, report
    assert report["longest_stall_s"] < GIL_STALL_S, report
    assert report["correct"], report


@pytest.mark.timeout(150, method="thread")
def test_subgroup_destroyed_on_a_thread_while_the_default_group_runs(rank):
    report = scenario(rank, "destroy_subgroup_on_thread_under_traffic", timeout_s=60.0)
    assert report["thread_done"] and report["error"] is None, report
    assert report["thread_s"] < THREAD_FEW_S, report
    assert report["correct_subgroup"], report
    assert report["correct_default"], report
    assert report["default_after"], report


# --- Abort under a collective host call --------------------------------------------------------
# Rank 0 enters a collective host call that rank 1 never joins; a Python thread aborts the
# group's backend 1 s in (fault_world.ABORT_AFTER_S, group timeout 30 s), or the group's 3 s
# timeout must end it (fault_world.SHORT_TIMEOUT_S).
HOST_CALL_TIMEOUT_S = 3.0
HOST_CALL_SLACK_S = 5.0  # "a few seconds" after the abort or past the timeout
HOST_CALLS = ["window", "split", "first_use", "staging"]


# A blocking communicator's own init cannot be aborted (no communicator exists until it returns);
# the copy engine's staging needs load/store-reachable peers: blocking variants of the other two.
HOST_CALL_CASES = [(call, how) for call in HOST_CALLS for how in ("abort", "timeout")] + [
    ("window", "abort_blocking"),
    ("split", "abort_blocking"),
]


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize(
    ("call", "how"), HOST_CALL_CASES, ids=[f"{c}-{h}" for c, h in HOST_CALL_CASES]
)
def test_abort_under_a_collective_host_call_raises(rank, call, how):
    """Was: the abort freed the communicator under the thread inside NCCL (a crash), or nothing
    ended the call (a hang). Now: that call raises DistBackendError, destroy returns, exit 0."""
    report = scenario(rank, f"{how}_during_{call}", timeout_s=90.0)
    if "skipped" in report:  # decided from the same facts on both ranks, after the child ran
        pytest.skip(report["skipped"])
    assert report["destroy_returned"] and report["destroy_s"] < 10.0, report
    if rank != 0:
        assert report["peer_done"], report  # rank 0 finished its call and destroy in time
        return
    assert report["outcome"] == "raised", report
    assert report["is_dist_backend_error"], report
    if how != "timeout":
        assert report["abort_thread_done"], report
        assert not report["ended_before_abort"], report
        assert report["latency_s"] <= HOST_CALL_SLACK_S, report
    else:
        elapsed = report["elapsed_s"]
        assert HOST_CALL_TIMEOUT_S - 0.5 <= elapsed <= HOST_CALL_TIMEOUT_S + HOST_CALL_SLACK_S, (
            report
        )


# --- Faults across nodes (ranks sharing a GPU are nodes of their own) ---------------------------


@pytest.mark.timeout(150, method="thread")
def test_nccl_memory_churn_on_two_threads_is_no_false_timeout(rank):
    report = scenario(rank, "nccl_memory_churn_on_two_threads", timeout_s=120.0)
    assert report["threads_done"], report
    assert report["outcomes"] == [{"correct": True}, {"correct": True}], report


@pytest.mark.timeout(150, method="thread")
def test_a_killed_peer_is_named_by_op_sequence_number_and_group(rank):
    """Was: "NCCL reported an asynchronous error on group '0': ncclRemoteError ...", naming no
    op."""
    report = survivor_of_a_kill(rank, "peer_killed_mid_all_reduce", world=2)
    if report is not None:
        assert report["destroy_s"] < 10.0, report


def survivor_of_a_kill(rank: int, name: str, world: int) -> dict | None:
    """Runs scenario `name`, whose last rank kills itself (its child ends with SIGKILL, as
    planned), on the first `world` ranks; a survivor's report, once its DistBackendError was
    checked: it names the op, its sequence number and the group, within the timeout. None on
    the victim."""
    child = run_child_world(rank, SCRIPT, [name], 120.0, world=world)
    if child is None:
        pytest.skip(f"a {world}-rank scenario: it ran on ranks 0 to {world - 1}")
    if rank == world - 1:  # killed itself, not by run_child_world's timeout
        assert child.returncode == -9, (child.returncode, child.stderr[-3000:])
        assert "[killed: timed out]" not in child.stderr
        return None
    assert child.returncode == 0, (child.returncode, child.stdout[-2000:], child.stderr[-12000:])
    report = json.loads(child.stdout.strip().splitlines()[-1])
    error = report["error"] or ""
    assert re.search(r"nccl_core (synchronous )?allreduce \(seq \d+\) on group '0'", error), report
    named = re.findall(r"\(seq (\d+)\) on group '0'", error)
    assert len(named) == len(set(named)), f"an op named twice: {error}"
    assert report["error_s"] <= report["timeout_s"] + SLACK_S, report
    return report


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("first", [0, 1])
def test_a_clean_teardown_logs_nothing_whichever_rank_goes_first(rank, first):
    """Was: the rank that destroyed last logged an error-level "NCCL reported an asynchronous
    error ... remote process exited": its watchdog polled while the peer closed its sockets."""
    child = run_child_world(rank, SCRIPT, [f"clean_teardown_rank{first}_first"], 90.0, world=2)
    if child is None:
        pytest.skip("a two-rank scenario: it ran on ranks 0 and 1")
    assert child.returncode == 0, (child.returncode, child.stdout[-2000:], child.stderr[-12000:])
    assert json.loads(child.stdout.strip().splitlines()[-1])["correct"]
    logged = [line for line in child.stderr.splitlines() if "nccl_core" in line]
    assert not logged, logged


@needs_ranks(4)
@pytest.mark.timeout(150, method="thread")
def test_survivors_of_a_killed_rank_shrink_and_train_on(rank):
    """One rank of 4 is SIGKILLed mid all_reduce: the other 3 raise DistBackendError naming the
    op, its sequence number and the group within the timeout, shrink the group to themselves
    (SHRINK_ABORT) and train a DDP model that matches a 3-rank reference. Was: the failed
    group's communicator was aborted and shrink_group raised "was aborted"."""
    report = survivor_of_a_kill(rank, "killed_rank_then_shrink_and_train", world=4)
    if report is None:
        return
    assert report["world"] == 3, report
    assert report["probe"], report
    assert report["ddp_difference"] < 1e-5, report


@needs_ranks(4)
@pytest.mark.timeout(200, method="thread")
def test_a_replacement_of_a_killed_rank_joins_and_the_world_grows_back(rank):
    """One rank of 4 is SIGKILLed mid all_reduce, the others shrink the world to 3; a new
    process joins in its place (torch_nccl_core.join_group) as the 3 grow the world back
    (grow_group, NCCL's ncclCommGrow): every rank of the 4 trains a DDP model that matches a
    reference of the 4 ranks' batches. Where NCCL cannot grow, grow_group refuses naming it."""
    child = run_child_world(
        rank,
        SCRIPT,
        ["killed_rank_then_shrink_grow_and_train"],
        150.0,
        world=4,
        replace_killed=["replacement_joins_the_grown_world"]
        if torch_nccl_core.features()["comm_grow"]
        else (),
    )
    if rank == 3:  # the victim, then its replacement
        assert child.returncode == -9, (child.returncode, child.stderr[-3000:])
        if not torch_nccl_core.features()["comm_grow"]:
            return
        child = child.replacement
    assert child.returncode == 0, (child.returncode, child.stdout[-2000:], child.stderr[-12000:])
    report = json.loads(child.stdout.strip().splitlines()[-1])
    if not torch_nccl_core.features()["comm_grow"]:
        assert report["shrunk_world"] == 3 and report["probe"], report
        assert re.search(r"needs NCCL >= 2\.29 \(ncclCommGrow", report["refusal"] or ""), report
        return
    if rank != 3:
        assert report["shrunk_world"] == 3, report
        assert report["grow_s"] < 10.0, report
    assert (report["default"], report["world"], report["rank"]) == (True, 4, rank), report
    assert report["backend"] == "nccl_core", report
    assert report["probe"], report
    assert report["ddp_difference"] < 1e-5, report


@needs_ranks(4)
@pytest.mark.timeout(150, method="thread")
def test_rank_0_late_at_init_by_5_s(rank):
    report = scenario(rank, "rank0_late_at_init", world=4)
    assert report["correct"], report
    if rank != 0:
        assert 4.0 < report["init_s"] < 30.0, report  # it waited for rank 0, within the timeout


@needs_ranks(4)
@pytest.mark.timeout(150, method="thread")
def test_a_rank_that_never_joins_a_new_group_bounds_the_others_by_its_timeout(rank):
    """Was: NCCL's bootstrap waited for the absent rank for ever (a blocking communicator has
    no handle to abort until its initialization returns)."""
    report = scenario(rank, "rank_never_joins_new_group", world=4)
    if rank != 3:
        assert "rank(s) 3 of group" in (report["error"] or ""), report
        assert 3.0 <= report["error_s"] <= 3.0 + SLACK_S, report
    assert report["default_group_works"], report


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("first", ["window", "graph"])
def test_a_timeout_after_a_window_or_graph_leaves_cuda_healthy(rank, first):
    """What the soak's first cycle did at 2 ranks under MPS, where an illegal memory access then
    took down every rank (2026-11-25): a window made and freed, or a graph captured and
    destroyed, then an op that times out and aborts the communicator with its kernel in flight."""
    if first == "window" and (refusal := window_refusal()) is not None:
        pytest.skip(refusal)
    report = scenario(rank, f"timeout_after_a_{first}")
    if rank == 0:
        assert re.search(r"allreduce \(seq \d+\)", report["error"] or ""), report
    assert report["cuda_ok"] is True, report

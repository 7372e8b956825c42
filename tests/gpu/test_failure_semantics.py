"""Failure semantics as programs meet them: destroy right after sync ops, the host far ahead of
the GPU, a capture right after eager traffic, teardown with live CUDA graphs, re-init in the same
process, the watchdog never blocking, no set_device. Each scenario runs in a two-process world of
its own (fault_world.py), observed from here: a hang or crash is the failure being looked for.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest

from .helpers import run_child_world

SCRIPT = pathlib.Path(__file__).resolve().parent / "fault_world.py"
SLACK_S = 2.0  # what the issue allows past the timeout: watchdog polling and the abort
# A shorter bound on each child, for runs against code where the scenarios hang.
CHILD_TIMEOUT_CAP_S = float(os.environ.get("NCCL_CORE_TEST_CHILD_TIMEOUT_S", "inf"))


def scenario(rank: int, name: str, timeout_s: float = 90.0) -> dict:
    """Runs scenario `name` on both ranks; this rank's report, once its child exited with 0."""
    child = run_child_world(rank, SCRIPT, [name], min(timeout_s, CHILD_TIMEOUT_CAP_S))
    assert child.returncode == 0, (
        f"{name}: rc {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-4000:]}"
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


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

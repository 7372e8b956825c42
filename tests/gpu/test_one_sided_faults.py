"""One-sided ops under faults, each scenario in a two-process world of its own
(one_sided_fault_world.py), observed from here:

  * a wait_signal whose signal never comes is failed by the group's watchdog at the group's
    timeout, as DistBackendError naming wait_signal, the peer and the group, and its stream is
    released: on both engines, through the Communicator methods and the torch ops. Before the
    watchdog knew one-sided ops, nothing was raised and the stream waited until the group was
    destroyed;
  * put_signal checks its offset against the target rank's window, which may be smaller than
    this rank's: a put that only fits here is refused, one that only fits there is carried out.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest

from .helpers import needs_ranks, run_child_world

# Each scenario scripts the parts of two ranks: it runs in a world of the suite's first two
# ranks; the others wait for it.
pytestmark = needs_ranks(2)

SCRIPT = pathlib.Path(__file__).resolve().parent / "one_sided_fault_world.py"
SLACK_S = 2.0  # what the issue allows past the timeout: watchdog span, polling and the abort
# A shorter bound on each child, for runs against code where the scenarios hang.
CHILD_TIMEOUT_CAP_S = float(os.environ.get("NCCL_CORE_TEST_CHILD_TIMEOUT_S", "inf"))

ENGINES = ["nccl", "load_store"]
APIS = ["method", "op"]


def scenario(rank: int, *args: str, timeout_s: float = 90.0) -> tuple[dict, str]:
    """Runs the scenario on both ranks; this rank's report, and what to show if the child did
    not exit cleanly (an empty string when it did). The report is printed before teardown, so a
    teardown that hangs still leaves one."""
    child = run_child_world(rank, SCRIPT, list(args), min(timeout_s, CHILD_TIMEOUT_CAP_S), world=2)
    if child is None:
        pytest.skip("a two-rank scenario: it ran on ranks 0 and 1")
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    trouble = (
        ""
        if child.returncode == 0
        else f"{args}: rc {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-4000:]}"
    )
    assert lines, trouble or f"{args}: no report\n{child.stdout[-2000:]}"
    return json.loads(lines[-1]), trouble


def skip_if_unavailable(report: dict) -> None:
    """The engine's availability is the same on both ranks, so both skip together."""
    if "unavailable" in report:
        pytest.skip(report["unavailable"])


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("engine", ENGINES)
def test_wait_for_a_signal_that_never_comes_fails_at_the_timeout(rank, engine, api):
    """Was: the wait was unknown to the watchdog: no error, and the stream stayed blocked."""
    report, trouble = scenario(rank, "wait_never_signalled", engine, api)
    skip_if_unavailable(report)
    if rank == 0:
        group, timeout_s = report["group"], report["timeout_s"]
        assert report["enqueue_s"] < 1.0, report  # the host only enqueues the wait
        assert report["dist_backend_error"], report
        assert report["error_s"] <= timeout_s + SLACK_S, report
        error = report["error"]
        assert "caught collective operation timeout" in error, error
        assert re.search(
            rf"synchronous wait_signal \(seq \d+, peer 1\) on group '{re.escape(group)}'", error
        ), error
        assert re.search(rf"nccl_core signal .*group '{re.escape(group)}'", error), error
        assert "DistBackendError" in (report["all_reduce_error"] or ""), report
        assert "wait_signal" in report["all_reduce_error"], report
        # Later one-sided ops name themselves and the group, then the failure.
        put = report["put_signal_error"] or ""
        assert put.startswith("DistBackendError"), report
        assert re.search(rf"nccl_core put_signal .*group '{re.escape(group)}': ", put), put
        assert "wait_signal" in put, put
        # The abort ended the wait: the stream went on.
        assert report["drained_s"] is not None, report
        assert report["error_s"] + report["drained_s"] <= timeout_s + SLACK_S + 1.0, report
    assert not trouble, trouble


@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("api", APIS)
def test_put_signal_checks_the_target_rank_window(rank, api):
    """Was: offsets were checked against this rank's window, so a put beyond a smaller peer
    window was carried out (writing past it) and one that fit a larger peer window was refused
    (and the peer waited for it forever)."""
    report, trouble = scenario(rank, "asymmetric_windows", "auto", api)
    skip_if_unavailable(report)
    assert report["failed"] is None, report
    assert report["drained_s"] is not None, report  # every expected signal arrived
    assert report["correct"], report
    if rank == 0:
        assert report["window_bytes"] == 4 * 1024 * 4
        refused = report["refused"] or ""
        assert refused.startswith("ValueError"), report
        assert "do not fit in the window (8192 bytes at rank 1)" in refused, refused
    else:
        assert report["window_bytes"] == 2 * 1024 * 4
    assert not trouble, trouble

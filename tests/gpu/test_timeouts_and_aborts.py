"""Failures and teardown: a collective one rank skips times out; abort and shutdown are idempotent.

These tests leave aborted groups behind (destroyed, their NCCL state gone for good); each one
ends by showing that the default group still works on every rank, so tests after them, in this
file or another, run on a healthy world whatever the order.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from .helpers import (
    ASYNC_MODES,
    WORLD_SIZE,
    assert_equal,
    assert_raised,
    needs_ranks,
    probe_group,
    raised_by,
)

GROUP_TIMEOUT = timedelta(seconds=5)
DETECTION_SLACK_S = 20.0  # "the timeout plus a few seconds": watchdog polling and the abort
HOST_WAIT = timedelta(seconds=60)  # longer than GROUP_TIMEOUT, so the watchdog acts first
NAMES_ALL_REDUCE = r"(?i)all_?reduce"


def _lonely_all_reduce(group, async_op: bool) -> tuple[BaseException | None, float]:
    """An all_reduce on `group` that no other rank joins: what it raised, and after how long."""
    tensor = torch.ones(1024, device="cuda")
    start = time.monotonic()
    if async_op:
        # Across nodes NCCL may connect the peers inside the call (an algorithm's first use), so
        # the timeout can surface there rather than in wait().
        error = raised_by(
            lambda: dist.all_reduce(tensor, group=group, async_op=True).wait(timeout=HOST_WAIT)
        )
    else:
        error = raised_by(lambda: dist.all_reduce(tensor, group=group))
        if error is None:
            # The call only enqueued: the wait() of a sync op orders streams, as in
            # ProcessGroupNCCL. The stream drains once the watchdog aborts the communicator.
            torch.cuda.current_stream().synchronize()
    return error, time.monotonic() - start


def _group_timing_out_after(timeout: timedelta, how: str) -> dist.ProcessGroup:
    """A new nccl_core group whose timeout is `timeout`, given at creation or set later."""
    if how == "new_group":
        return dist.new_group(backend="nccl_core", timeout=timeout)
    group = dist.new_group(backend="nccl_core", timeout=HOST_WAIT * 2)
    group.set_timeout(timeout)  # dist.set_timeout(timeout, group) from torch 2.14 on
    return group


@needs_ranks(2)  # a peer goes quiet
@pytest.mark.parametrize("how", ["new_group", "set_timeout"])
@pytest.mark.parametrize("async_op", ASYNC_MODES)
def test_collective_skipped_by_a_peer_times_out(rank, async_op, how):
    group = _group_timing_out_after(GROUP_TIMEOUT, how)
    warm_up = probe_group(group)  # the communicator works on every rank before the others go quiet
    error = later = None
    elapsed = 0.0
    if rank == 0:
        error, elapsed = _lonely_all_reduce(group, async_op)
        later = raised_by(lambda: dist.all_reduce(torch.ones(8, device="cuda"), group=group))
    # The other ranks issue nothing more on `group`; they wait here, on the default group, until
    # rank 0 is done, so that nothing they do to `group` can end rank 0's op early.
    dist.barrier()
    default_group = probe_group()
    dist.destroy_process_group(group)

    assert_equal(*warm_up)
    assert_equal(*default_group)
    if rank == 0:
        if async_op:
            assert_raised(error, dist.DistBackendError, NAMES_ALL_REDUCE)
        else:  # the failure reaches the host from the call itself or from the next op
            failure = error if error is not None else later
            assert_raised(failure, dist.DistBackendError, NAMES_ALL_REDUCE)
        timeout_s = GROUP_TIMEOUT.total_seconds()
        assert timeout_s - 0.5 <= elapsed <= timeout_s + DETECTION_SLACK_S, (
            f"the failure surfaced after {elapsed:.1f}s; the group's timeout is {timeout_s}s"
        )
        assert_raised(later, dist.DistBackendError)  # the group stays failed


@needs_ranks(2)  # a peer arrives late
@pytest.mark.skipif(
    not hasattr(dist.ProcessGroup, "_add_ephemeral_timeout"),
    reason="timeout extensions need torch >= 2.14",
)
@pytest.mark.parametrize("async_op", ASYNC_MODES)
def test_a_timeout_extension_carries_a_rank_through_a_late_peer(rank, async_op):
    """torch.compile extends the timeouts of a rank whose cache hit saved compiling time
    (ProcessGroup._add_ephemeral_timeout): its next collective waits for a peer that is still
    compiling past the group's timeout (when the extension ends: tests/cpu/test_fake_nccl.py)."""
    group = dist.new_group(backend="nccl_core", timeout=timedelta(seconds=2))
    warm_up = probe_group(group)
    if rank == 0:
        group._add_ephemeral_timeout(timedelta(seconds=30))
    else:
        time.sleep(5)  # compiling, as it were
    tensor = torch.full((1024,), float(rank + 1), device="cuda")

    def all_reduce():
        work = dist.all_reduce(tensor, group=group, async_op=async_op)
        if async_op:
            work.wait()
        torch.cuda.current_stream().synchronize()

    error = raised_by(all_reduce)
    after = raised_by(lambda: probe_group(group))
    dist.barrier()
    dist.destroy_process_group(group)

    assert_equal(*warm_up)
    assert error is None and after is None, (error, after)
    total = WORLD_SIZE * (WORLD_SIZE + 1) / 2  # of rank + 1 over the ranks
    assert_equal(tensor, torch.full((1024,), total, device="cuda"))


@pytest.mark.parametrize("teardown", ["shutdown", "abort"])
def test_teardown_is_idempotent(teardown):
    group = dist.new_group(backend="nccl_core")
    probe = probe_group(group)
    torch.cuda.current_stream().synchronize()  # the op is over before the group goes away
    backend = group._get_backend(torch.device("cuda"))
    getattr(backend, teardown)()
    getattr(backend, teardown)()
    backend.abort()
    backend.shutdown()
    after = raised_by(lambda: dist.all_reduce(torch.ones(8, device="cuda"), group=group))
    dist.destroy_process_group(group)  # shuts the backend down once more
    again = raised_by(lambda: dist.destroy_process_group(group))
    default_group = probe_group()

    assert_equal(*probe)
    assert_raised(after, RuntimeError)  # DistBackendError is one
    # torch itself forgets a destroyed group and may refuse to destroy it twice
    assert again is None or isinstance(again, ValueError), repr(again)
    assert_equal(*default_group)

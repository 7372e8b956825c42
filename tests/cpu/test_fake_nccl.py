"""The communicator's and the watchdog's failure logic against a scripted NCCL.

`torch_nccl_core._testing.FakeNccl` replaces the package's one table of NCCL entry points
(csrc/nccl/api.h) while it lives: communicators are host objects, a call can be held inside NCCL
or made to fail, and misuse that would crash real NCCL (ncclCommAbort under a call in progress,
a call on a freed communicator) is counted. So this runs in CI, which has no GPU.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from threads import in_thread

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


NCCL_SYSTEM_ERROR = 2  # ncclSystemError
NCCL_REMOTE_ERROR = 6  # ncclRemoteError


def create(timeout_s: float = 5.0, blocking: bool = False, label: str = "group 'g'"):
    return testing.create_communicator(2, 0, timedelta(seconds=timeout_s), blocking, label)


def wait_for(predicate, timeout_s: float = 5.0) -> float:
    """Seconds until `predicate()` held; fails the test past `timeout_s`."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "condition not reached in time"
        time.sleep(0.005)
    return time.monotonic() - start


def test_nonblocking_init_is_bounded_by_the_timeout(fake):
    fake.hold("ncclCommInitRankConfig")
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError) as raised:
        create(timeout_s=0.3, label="group 'late'")
    elapsed = time.monotonic() - start
    fake.release("ncclCommInitRankConfig")
    message = str(raised.value)
    assert "ncclCommInitRankConfig" in message and "group 'late'" in message
    assert "did not complete within 300 ms" in message
    assert 0.3 <= elapsed < 2.0
    assert fake.calls("ncclCommAbort") == 1  # the half-made communicator is freed


def test_failed_init_names_the_call_and_frees_the_communicator(fake):
    fake.fail_next("ncclCommInitRankConfig", NCCL_SYSTEM_ERROR)
    with pytest.raises(dist.DistBackendError, match=r"ncclCommInitRankConfig.*ncclSystemError"):
        create(blocking=True)
    assert fake.calls("ncclCommAbort") == 1


def abort_inside_a_split(fake, blocking: bool):
    """Aborts `comm` while a thread is held inside its ncclCommSplit; (comm, thread, outcome,
    when the abort was called). The abort itself must not wait for the call."""
    comm = create(blocking=blocking)
    fake.hold("ncclCommSplit")
    thread, outcome = in_thread(lambda: testing.split(comm, 0, 0))
    wait_for(lambda: fake.calls("ncclCommSplit") == 1)
    start = time.monotonic()
    testing.abort(comm)
    assert time.monotonic() - start < 0.5, "abort() must not wait for the call"
    return comm, thread, outcome, start


def test_abort_ends_a_blocking_host_call_another_thread_is_in(fake):
    """A blocking split waits in NCCL's bootstrap for peers that may never come: abort() raises
    NCCL's abort flag (ncclCommRevoke) without freeing the communicator under the call, which
    then returns; the free follows once it has."""
    _, thread, outcome, start = abort_inside_a_split(fake, blocking=True)
    thread.join(timeout=2)
    returned_s = time.monotonic() - start
    fake.release("ncclCommSplit")
    assert not thread.is_alive(), "the split was left blocked"
    assert returned_s < 1.0
    assert fake.calls("ncclCommRevoke") == 1
    assert isinstance(outcome.get("error"), dist.DistBackendError), outcome
    assert "group 'g' was aborted" in str(outcome["error"])
    assert fake.calls("ncclCommAbort") == 1  # after the call left (the fixture checks)


@pytest.mark.parametrize(
    ("fake", "blocking"),
    [({"revoke": False}, True), ({}, False)],
    ids=["blocking-without-revoke", "nonblocking"],
    indirect=["fake"],
)
def test_abort_never_frees_the_communicator_under_a_call(fake, blocking):
    """Abort while another thread is inside a collective host call (here a split), where NCCL
    cannot end the call: without ncclCommRevoke a blocking call runs on; a nonblocking one is
    settled by polling, which the abort ends."""
    comm, thread, outcome, _ = abort_inside_a_split(fake, blocking)
    assert comm.is_aborted
    if blocking:
        # Still inside NCCL: the free waits for the call to return.
        assert fake.inside("ncclCommSplit") == 1
        assert fake.calls("ncclCommAbort") == 0
    fake.release("ncclCommSplit")
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), dist.DistBackendError), outcome
    assert "group 'g' was aborted" in str(outcome["error"])
    # The parent, and in the blocking case the child the split made meanwhile. A nonblocking
    # split's child exists only if a poll that began before the abort reached NCCL after the
    # release (a preempted settling thread, seen once on a busy 2-core CI machine): it is then
    # aborted at once too. Either way none outlives the test (the fixture counts them).
    aborts = fake.calls("ncclCommAbort")
    assert (aborts == 2) if blocking else (aborts in (1, 2)), aborts


def test_abort_is_immediate_and_idempotent(fake):
    comm = create()
    testing.abort(comm)
    testing.abort(comm)
    assert fake.calls("ncclCommAbort") == 1
    with pytest.raises(dist.DistBackendError, match="group 'g' was aborted"):
        testing.split(comm, 0, 0)
    assert fake.calls("ncclCommSplit") == 0


@pytest.mark.parametrize(
    "call",
    ["ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
     "ncclSend", "ncclRecv"],
)  # fmt: skip
def test_collectives_enqueue_nothing_and_follow_the_script(fake, call):
    """The fake's collectives and point-to-point calls (benchmarks' --noop-nccl) are counted and
    return what the script says, whatever their signature."""
    comm = create()
    assert testing.enqueue(comm, call) == 0 and fake.calls(call) == 1
    fake.fail_next(call, NCCL_SYSTEM_ERROR)
    assert testing.enqueue(comm, call) == NCCL_SYSTEM_ERROR and fake.calls(call) == 2
    testing.abort(comm)


def test_a_failed_check_names_call_communicator_and_caller(fake):
    """Communicator::check's DistBackendError says which call failed on which communicator, and
    where it was called from (not where the check is defined)."""
    comm = create()
    with pytest.raises(dist.DistBackendError) as raised:
        testing.check(comm, NCCL_SYSTEM_ERROR, "ncclAllReduce")
    message = str(raised.value)
    assert "ncclAllReduce on group 'g'" in message and "ncclSystemError" in message
    assert "testing/bindings.cpp:" in message and "communicator.cpp" not in message
    assert not comm.is_aborted  # a failed call is reported, not acted on
    testing.abort(comm)


def test_a_new_timeout_bounds_later_nonblocking_calls(fake):
    """set_timeout reaches the communicator: a split held inside NCCL ends at the new bound."""
    comm = create(timeout_s=30.0)
    testing.set_timeout(comm, timedelta(milliseconds=300))
    fake.hold("ncclCommSplit")
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="did not complete within 300 ms"):
        testing.split(comm, 0, 0)
    assert time.monotonic() - start < 2.0
    fake.release("ncclCommSplit")
    assert comm.is_aborted


def test_a_settle_that_outlives_the_timeout_aborts(fake):
    comm = create(timeout_s=0.2)
    fake.hold("ncclCommSplit")
    start = time.monotonic()
    expected = "ncclCommSplit on the NCCL communicator of group 'g' did not complete within 200 ms"
    with pytest.raises(dist.DistBackendError, match=expected):
        testing.split(comm, 0, 0)
    assert time.monotonic() - start < 2.0
    fake.release("ncclCommSplit")
    assert comm.is_aborted and fake.calls("ncclCommAbort") == 1


NCCL_SHRINK_ABORT = 1


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "nonblocking"])
def test_shrink_renumbers_the_ranks_that_stay(fake, blocking):
    comm = testing.create_communicator(4, 2, timedelta(seconds=5), blocking, "group 'g'")
    child = testing.shrink(comm, [0, 3], NCCL_SHRINK_ABORT)
    assert (child.rank, child.size) == (1, 2)
    assert fake.last_shrink_flags == NCCL_SHRINK_ABORT
    assert not comm.is_aborted  # the parent stays the caller's to end
    testing.abort(child)
    testing.abort(comm)


def test_a_shrink_that_outlives_the_timeout_aborts_and_names_the_call(fake):
    comm = create(timeout_s=0.2)
    fake.hold("ncclCommShrink")
    start = time.monotonic()
    with pytest.raises(
        dist.DistBackendError, match=r"ncclCommShrink .*did not complete within 200 ms"
    ):
        testing.shrink(comm, [1], 0)
    assert time.monotonic() - start < 2.0
    fake.release("ncclCommShrink")
    assert comm.is_aborted and fake.calls("ncclCommAbort") == 1


def test_a_failed_shrink_names_the_call_and_leaves_the_parent_usable(fake):
    comm = create(blocking=True)
    fake.fail_next("ncclCommShrink", NCCL_SYSTEM_ERROR)
    with pytest.raises(dist.DistBackendError, match=r"ncclCommShrink.*ncclSystemError"):
        testing.shrink(comm, [1], 0)
    assert not comm.is_aborted
    child = testing.split(comm, 0, 0)
    testing.abort(child)
    testing.abort(comm)


def watchdog(comm, store, timeout_s: float = 30.0):
    return testing.Watchdog(comm, store, "g", "abort-key", timedelta(seconds=timeout_s))


def test_an_asynchronous_error_while_idle_fails_the_group_quietly(fake, capfd):
    """No op in flight: on the network transport that is a peer that closed its connections (a
    clean teardown). The group fails, so that the next op raises at once, but nothing is logged
    and no peer is told."""
    comm = create()
    store = dist.HashStore()
    dog = watchdog(comm, store)
    fake.set_async_error(NCCL_REMOTE_ERROR)
    elapsed = wait_for(lambda: dog.failure is not None, timeout_s=2.0)
    assert elapsed < 0.5  # polled every 50 ms
    assert "group 'g' failed while no op was in flight" in dog.failure
    assert "asynchronous error: ncclRemoteError" in dog.failure
    assert "last message: fake NCCL" in dog.failure
    assert comm.is_aborted and fake.calls("ncclCommAbort") == 1
    assert not store.check(["abort-key"])
    dog.stop()
    assert "[nccl_core]" not in capfd.readouterr().err


def test_an_op_held_in_nccls_enqueue_times_out_and_the_abort_ends_it(fake, capfd):
    """NCCL connects peers at an algorithm's first use, inside the op's enqueue on the host; a
    blocking communicator waits there for peers that never join. Was: the watchdog timed ops
    only once enqueued, so the op hung for ever (4 ranks sharing a GPU, a lonely all_reduce)."""
    comm = create(blocking=True)
    store = dist.HashStore()
    dog = watchdog(comm, store)
    fake.hold("ncclAllReduce")
    start = time.monotonic()
    thread, outcome = in_thread(lambda: dog.enqueue_all_reduce(7, timedelta(seconds=0.3)))
    thread.join(timeout=5)
    elapsed = time.monotonic() - start
    fake.release("ncclAllReduce")
    assert not thread.is_alive(), "the enqueue was left blocked"
    assert 0.3 <= elapsed < 1.5
    assert isinstance(outcome.get("error"), dist.DistBackendError), outcome
    assert "nccl_core allreduce (seq 7) on group 'g' has been in NCCL's enqueue" in dog.failure
    assert fake.calls("ncclCommRevoke") == 1 and fake.calls("ncclCommAbort") == 1
    assert store.check(["abort-key"])  # the peers are told
    dog.stop()
    assert "has been in NCCL's enqueue" in capfd.readouterr().err


def test_an_op_that_leaves_nccls_enqueue_in_time_is_not_timed_out(fake):
    comm = create(blocking=True)
    dog = watchdog(comm, dist.HashStore())
    fake.hold("ncclAllReduce")
    thread, outcome = in_thread(lambda: dog.enqueue_all_reduce(7, timedelta(seconds=1)))
    time.sleep(0.3)
    fake.release("ncclAllReduce")
    thread.join(timeout=5)
    time.sleep(1.2)  # past the timeout: the op left the enqueue, nothing is timed any more
    assert outcome.get("error") is None, outcome
    assert dog.failure is None and fake.calls("ncclCommAbort") == 0
    dog.stop()


def test_watchdog_follows_a_peers_abort(fake):
    comm = create()
    store = dist.HashStore()
    dog = watchdog(comm, store)
    store.set("abort-key", "rank 1 timed out")
    wait_for(lambda: dog.failure is not None, timeout_s=3.0)
    assert dog.failure == "a peer aborted group 'g': rank 1 timed out"
    assert comm.is_aborted and fake.calls("ncclCommAbort") == 1
    assert store.get("abort-key") == b"rank 1 timed out"  # not rewritten by this rank
    dog.stop()


def test_abort_hooks_run_in_id_order_before_the_abort(fake):
    """c10d's abort hooks (torch >= 2.14): run before ncclCommAbort, a failing one is logged."""
    comm = create()
    store = dist.HashStore()
    dog = watchdog(comm, store)
    seen = []

    def failing():
        raise RuntimeError("a hook that fails")

    dog.add_abort_hook(2, lambda: seen.append(("second", fake.calls("ncclCommAbort"))))
    dog.add_abort_hook(1, failing)
    dog.add_abort_hook(0, lambda: seen.append(("first", fake.calls("ncclCommAbort"))))
    store.set("abort-key", "rank 1 failed")  # a failure the watchdog detects: hooks run
    wait_for(lambda: dog.failure is not None)
    assert seen == [("first", 0), ("second", 0)]
    assert fake.calls("ncclCommAbort") == 1
    dog.stop()


@pytest.mark.skipif(
    not hasattr(testing.Watchdog, "add_completion_hook"),
    reason="c10d completion hooks need torch >= 2.15",
)
def test_completion_hooks_see_each_finished_async_op_once(fake):
    """torch 2.15's completion hooks: one call per Work, with its completion key, no duration."""
    comm = create()
    dog = watchdog(comm, dist.HashStore())
    seen = []
    dog.add_completion_hook(3, lambda key, duration: seen.append((key, duration)))
    keys = [dog.track_finished_op(seq) for seq in (1, 2)]
    wait_for(lambda: len(seen) == 2)
    time.sleep(0.2)  # a few more watchdog polls: nothing fires twice
    assert seen == [(keys[0], None), (keys[1], None)]
    assert dog.failure is None
    dog.stop()
    testing.abort(comm)


def test_a_timeout_extension_ends_once_the_op_issued_after_it_finished(fake):
    """addEphemeralTimeout (torch.compile adds one on each cache hit): each extension lengthens
    timeouts until the first op issued after it finished, and no sooner."""
    comm = create()
    dog = watchdog(comm, dist.HashStore())
    dog.track_finished_op(1)
    dog.add_ephemeral_timeout(timedelta(seconds=7), first_seq=2)
    dog.add_ephemeral_timeout(timedelta(seconds=3), first_seq=3)
    polls = fake.calls("ncclCommGetAsyncError")
    wait_for(lambda: fake.calls("ncclCommGetAsyncError") >= polls + 2)  # op 2 not issued yet
    before_op_2 = dog.ephemeral_timeout
    dog.track_finished_op(2)
    wait_for(lambda: dog.ephemeral_timeout == timedelta(seconds=3))
    dog.track_finished_op(3)
    wait_for(lambda: dog.ephemeral_timeout == timedelta(0))
    assert before_op_2 == timedelta(seconds=10)
    assert dog.failure is None
    dog.stop()
    testing.abort(comm)


def test_watchdog_stops_without_touching_a_healthy_communicator(fake):
    comm = create()
    dog = watchdog(comm, dist.HashStore())
    wait_for(lambda: fake.calls("ncclCommGetAsyncError") >= 2)
    start = time.monotonic()
    dog.stop()
    assert time.monotonic() - start < 0.5
    assert dog.failure is None
    assert not comm.is_aborted and fake.calls("ncclCommAbort") == 0
    testing.abort(comm)


def test_watchdog_poll_racing_an_abort_stays_off_the_freed_communicator(fake):
    """Polls and aborts from other threads: the fake counts any use after free."""
    comm = create()
    dog = watchdog(comm, dist.HashStore())
    wait_for(lambda: fake.calls("ncclCommGetAsyncError") >= 1)
    for _ in range(20):
        testing.abort(comm)
    time.sleep(0.2)  # a few more watchdog polls after the abort
    dog.stop()
    assert fake.calls("ncclCommAbort") == 1


@pytest.mark.parametrize("blocking", [True, False])
def test_flush_finalizes_before_the_abort_frees(fake, blocking):
    """A clean shutdown lets NCCL's proxy deliver what finished ops still move (ncclCommFinalize),
    then frees the communicator."""
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), blocking, "group 'g'")
    assert testing.flush(comm) is True
    testing.abort(comm)
    assert fake.calls("ncclCommFinalize") == 1 and fake.calls("ncclCommAbort") == 1
    assert fake.calls("ncclCommRevoke") == 0


@pytest.mark.parametrize("blocking", [True, False])
def test_a_flush_a_peer_never_takes_ends_at_the_timeout(fake, blocking):
    """Past the timeout the flush gives up and the abort follows. Nothing ends a blocking
    ncclCommFinalize early (NCCL refuses ncclCommRevoke once it started: was, a revoke that
    ended only the fake's finalize): it goes on, on a thread of its own, and the communicator is
    freed once it returns."""
    comm = testing.create_communicator(2, 0, timedelta(milliseconds=300), blocking, "group 'g'")
    fake.hold("ncclCommFinalize")
    start = time.monotonic()
    flushed = testing.flush(comm)
    elapsed = time.monotonic() - start
    testing.abort(comm)
    freed_while_held = fake.calls("ncclCommAbort")
    fake.release("ncclCommFinalize")
    wait_for(lambda: fake.calls("ncclCommAbort") == 1)
    assert flushed is False and 0.25 < elapsed < 2.0, elapsed
    assert fake.calls("ncclCommRevoke") == 0
    # A nonblocking finalize is ended by the abort; a blocking one is waited for.
    assert freed_while_held == (0 if blocking else 1)
    assert fake.aborted_under_call == 0 and fake.used_after_free == 0


def test_a_communicator_is_revoked_once_and_not_after_a_finalize(fake):
    """NCCL takes one ncclCommRevoke, and none once ncclCommFinalize started (both set its
    finalizeCalled; init.cc); a refused revoke was logged as an NCCL error."""
    revoked = testing.create_communicator(2, 0, timedelta(seconds=5), True, "group 'g'")
    assert testing.stop_kernels(revoked) is True
    assert testing.stop_kernels(revoked) is False
    assert testing.flush(revoked) is False
    finalized = testing.create_communicator(2, 0, timedelta(seconds=5), True, "group 'h'")
    assert testing.flush(finalized) is True
    assert testing.stop_kernels(finalized) is False
    assert fake.calls("ncclCommRevoke") == 1 and fake.calls("ncclCommFinalize") == 1
    testing.abort(revoked)
    testing.abort(finalized)


@pytest.mark.parametrize(
    ("label", "cause", "expected"),
    [
        # The group failed at this very op (the watchdog named it): said once, not twice.
        (
            "nccl_core allreduce (seq 16) on group '0'",
            "nccl_core allreduce (seq 16) on group '0' failed: ncclRemoteError",
            "nccl_core allreduce (seq 16) on group '0' failed: ncclRemoteError",
        ),
        (
            "nccl_core allreduce (seq 16) on group '0'",
            "nccl_core synchronous allreduce (seq 16) on group '0' failed: timeout",
            "nccl_core synchronous allreduce (seq 16) on group '0' failed: timeout",
        ),
        (
            "nccl_core put_signal (seq 3, peer 1) on group 'g'",
            "nccl_core synchronous put_signal (seq 3, peer 1) on group 'g' failed: x",
            "nccl_core synchronous put_signal (seq 3, peer 1) on group 'g' failed: x",
        ),
        (
            "nccl_core allreduce (seq 5) on group 'g'",
            "Watchdog caught collective operation timeout: nccl_core allreduce (seq 5) on group "
            "'g' has been in NCCL's enqueue for at least 5001 ms",
            "Watchdog caught collective operation timeout: nccl_core allreduce (seq 5) on group "
            "'g' has been in NCCL's enqueue for at least 5001 ms",
        ),
        # Another op, number or group: this op's failure, then its cause.
        (
            "nccl_core allreduce (seq 17) on group '0'",
            "nccl_core allreduce (seq 16) on group '0' failed: x",
            "nccl_core allreduce (seq 17) on group '0' failed: "
            "nccl_core allreduce (seq 16) on group '0' failed: x",
        ),
        (
            "nccl_core allreduce (seq 1) on group '0'",
            "nccl_core allreduce (seq 16) on group '0' failed: x",
            "nccl_core allreduce (seq 1) on group '0' failed: "
            "nccl_core allreduce (seq 16) on group '0' failed: x",
        ),
        (
            "nccl_core allreduce (seq 16) on group '1'",
            "nccl_core allreduce (seq 16) on group '0' failed: x",
            "nccl_core allreduce (seq 16) on group '1' failed: "
            "nccl_core allreduce (seq 16) on group '0' failed: x",
        ),
        (
            "nccl_core allreduce (seq 16) on group '0'",
            "group '0' failed while no op was in flight: x",
            "nccl_core allreduce (seq 16) on group '0' failed: "
            "group '0' failed while no op was in flight: x",
        ),
    ],
)
def test_an_op_that_failed_with_its_group_is_named_once(label, cause, expected):
    """Was: "nccl_core allreduce (seq 16) on group '0' failed: nccl_core allreduce (seq 16) on
    group '0' failed: NCCL reported ..." where the watchdog had failed the group at that op."""
    assert testing.op_failure(label, cause) == expected

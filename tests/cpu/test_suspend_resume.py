"""Communicator.suspend / resume / memoryStats (NCCL >= 2.29.7's suspend) against the
scripted NCCL: what reaches NCCL, what is refused while suspended, and the refusal where the
loaded NCCL has no ncclCommSuspend."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


NCCL_SYSTEM_ERROR = 2  # ncclSystemError
NCCL_INVALID_USAGE = 5  # ncclInvalidUsage
SUSPENDABLE = 1 << 20  # FakeNccl::kSuspendableBytes
PERSISTENT = 64 << 10  # FakeNccl::kPersistentBytes


def create(blocking: bool = True):
    return testing.create_communicator(2, 0, timedelta(seconds=5), blocking, "group 'g'")


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "nonblocking"])
def test_suspend_and_resume_reach_nccl_once_each_however_often_called(fake, blocking):
    comm = create(blocking)
    testing.suspend(comm)
    testing.suspend(comm)  # NCCL itself would answer ncclInvalidUsage
    assert fake.calls("ncclCommSuspend") == 1
    assert testing.memory_stats(comm)["suspended"] is True
    testing.resume(comm)
    testing.resume(comm)
    assert fake.calls("ncclCommResume") == 1
    assert testing.memory_stats(comm)["suspended"] is False
    testing.abort(comm)


def test_memory_stats_are_ncclcommmemstats(fake):
    comm = create()
    assert testing.memory_stats(comm) == {
        "suspendable": SUSPENDABLE,
        "persistent": PERSISTENT,
        "total": SUSPENDABLE + PERSISTENT,
        "suspended": False,
    }
    testing.abort(comm)


def test_host_calls_are_refused_while_suspended_and_taken_after_resume(fake):
    comm = create()
    testing.suspend(comm)
    with pytest.raises(RuntimeError, match=r"group 'g'.*suspended.*resume"):
        testing.split(comm, 0, 0)
    assert fake.calls("ncclCommSplit") == 0  # refused before NCCL
    testing.resume(comm)
    child = testing.split(comm, 0, 0)
    assert fake.calls("ncclCommSplit") == 1
    testing.abort(child)
    testing.abort(comm)


def test_a_failed_suspend_names_the_call_and_leaves_the_communicator_active(fake):
    comm = create()
    fake.fail_next("ncclCommSuspend", NCCL_SYSTEM_ERROR)
    with pytest.raises(dist.DistBackendError, match=r"ncclCommSuspend.*ncclSystemError"):
        testing.suspend(comm)
    assert testing.memory_stats(comm)["suspended"] is False
    child = testing.split(comm, 0, 0)  # not refused: still active
    testing.abort(child)
    testing.suspend(comm)  # a second try goes through
    assert fake.calls("ncclCommSuspend") == 2
    testing.abort(comm)


@pytest.mark.parametrize("fake", [{"suspend": False}], indirect=True, ids=["nccl<2.29.7"])
@pytest.mark.parametrize("call", ["suspend", "resume", "memory_stats"])
def test_without_nccls_suspend_each_call_names_the_nccl_it_needs(fake, call):
    comm = create()
    with pytest.raises(NotImplementedError, match=f"nccl_core {call}: needs NCCL >= 2.29.7"):
        getattr(testing, call)(comm)
    child = testing.split(comm, 0, 0)  # the communicator is untouched
    testing.abort(child)
    testing.abort(comm)


def test_abort_of_a_suspended_communicator_frees_it(fake):
    comm = create()
    testing.suspend(comm)
    assert not testing.flush(comm)  # nothing in flight, nothing to finalize
    assert fake.calls("ncclCommFinalize") == 0
    testing.abort(comm)
    assert fake.live == 0


def test_nccls_refusal_before_its_barrier_is_a_state_error_and_leaves_it_active(fake):
    """ncclInvalidUsage: a memory manager shared with another communicator (split_share), or
    NCCL_MEM_MANAGER_DISABLE; NCCL returns it before its barrier, on every rank alike."""
    comm = create()
    fake.fail_next("ncclCommSuspend", NCCL_INVALID_USAGE)
    with pytest.raises(RuntimeError, match=r"group 'g' cannot be suspended: NCCL refused") as e:
        testing.suspend(comm)
    assert not isinstance(e.value, dist.DistBackendError)
    assert testing.memory_stats(comm)["suspended"] is False
    testing.abort(testing.split(comm, 0, 0))  # still takes host calls
    testing.abort(comm)

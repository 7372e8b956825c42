"""Elastic grow (NCCL >= 2.29's ncclCommGrow) through the scripted NCCL: the communicator's part,
and what grow and join refuse before NCCL is asked. The grow itself, a killed rank replaced by a
new process, runs in tests/gpu/test_failure_semantics.py."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from threads import in_thread

import torch_nccl_core
from torch_nccl_core import _C

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


NCCL_SYSTEM_ERROR = 2  # ncclSystemError
NAME = "nccl_core_grow:k"
PLAN = "nccl_core/grow/plan"
WITHOUT_GROW = pytest.mark.parametrize("fake", [{"grow": False}], indirect=True)


def create(rank: int = 0, size: int = 2):
    return testing.create_communicator(size, rank, timedelta(seconds=5), True, "group 'g'")


def on(fake) -> torch_nccl_core.Options:
    """Options whose groups call `fake`."""
    options = torch_nccl_core.Options()
    fake.inject(options)
    return options


def join(fake, store, rank: int, size: int, timeout_s: float = 5.0):
    return _C.NcclCoreBackend._join(
        store, rank, size, NAME, on(fake), timedelta(seconds=timeout_s), 0
    )


@pytest.fixture
def group(fake, tmp_path):
    """A one-rank nccl_core backend on the fake (no communicator until its first op)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    backend = _C.NcclCoreBackend(store, 0, 1, "g", on(fake), timedelta(seconds=5))
    yield backend
    backend.shutdown()


def test_a_grow_keeps_the_ranks_and_a_joining_process_takes_its_own(fake):
    first, second = create(0), create(1)
    grown = [testing.grow(first, 4, True), testing.grow(second, 4, False)]
    joined = testing.join(4, 3, timedelta(seconds=5))
    shapes = [(c.rank, c.size) for c in [*grown, joined]]
    calls = (fake.calls("ncclCommGetUniqueId"), fake.calls("ncclCommGrow"))
    parents_alive = not (first.is_aborted or second.is_aborted)
    for comm in [*grown, joined, first, second]:
        testing.abort(comm)
    assert shapes == [(0, 4), (1, 4), (3, 4)]
    assert calls == (1, 3)  # one id (the root's), three grows
    assert parents_alive  # the parent stays the caller's to end


def test_a_failed_grow_names_the_call_and_leaves_the_parent_usable(fake):
    comm = create()
    fake.fail_next("ncclCommGrow", NCCL_SYSTEM_ERROR)
    with pytest.raises(dist.DistBackendError, match=r"ncclCommGrow.*ncclSystemError"):
        testing.grow(comm, 3, True)
    assert not comm.is_aborted
    grown = testing.grow(comm, 3, True)
    testing.abort(grown)
    testing.abort(comm)


def test_a_nonblocking_grow_is_waited_for_on_the_new_communicator(fake):
    """NCCL runs a grow as the new communicator's job and may answer ncclSuccess while it is in
    progress: the grow returns once that settled."""
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), False, "group 'g'")
    fake.hold("ncclCommGrow")
    thread, outcome = in_thread(lambda: testing.grow(comm, 3, True, blocking=False))
    time.sleep(0.3)
    waited = thread.is_alive()
    fake.release("ncclCommGrow")
    thread.join(5.0)
    grown = outcome.get("result")
    shape = None if grown is None else (grown.rank, grown.size)
    for made in (grown, comm):
        if made is not None:
            testing.abort(made)
    assert waited, outcome
    assert shape == (0, 3), outcome


def test_a_nonblocking_grow_that_never_settles_ends_at_the_timeout(fake):
    comm = testing.create_communicator(2, 0, timedelta(seconds=0.2), False, "group 'g'")
    fake.hold("ncclCommGrow")
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError, match=r"ncclCommGrow .*did not complete within 200"):
        testing.grow(comm, 3, True, blocking=False)
    elapsed = time.monotonic() - start
    fake.release("ncclCommGrow")
    assert elapsed < 2.0
    assert not comm.is_aborted  # the new communicator was aborted, the parent goes on
    testing.abort(comm)


@WITHOUT_GROW
def test_without_ncclcommgrow_grow_and_join_refuse_naming_the_nccl_needed(fake):
    comm = create()
    store = dist.HashStore()
    needs = r"needs NCCL >= 2\.29 \(ncclCommGrow, ncclCommGetUniqueId\)"
    with pytest.raises(NotImplementedError, match=needs):
        testing.grow(comm, 4, True)
    with pytest.raises(NotImplementedError, match=needs):
        join(fake, store, 2, 4)
    assert fake.calls("ncclCommGrow") == 0 and not comm.is_aborted
    testing.abort(comm)


def test_grow_refuses_a_size_that_does_not_exceed_the_group(fake, group):
    with pytest.raises(ValueError, match=r"size must exceed the 1 ranks of group 'g', got 1"):
        group._grow(dist.HashStore(), 1, NAME)
    assert fake.calls("ncclCommGrow") == 0


def test_a_key_serves_one_grow(fake, group):
    store = dist.HashStore()
    store.add("nccl_core/grow/members/0", 1)  # this rank grew under it before
    with pytest.raises(ValueError, match="ran before: each grow needs a key of its own"):
        group._grow(store, 2, NAME)
    assert fake.calls("ncclCommGrow") == 0


def test_join_refuses_a_rank_the_growing_group_has(fake):
    store = dist.HashStore()
    store.set(PLAN, "2 4")
    with pytest.raises(
        ValueError,
        match=r"rank 1 is a rank of the growing group already \(ranks 0 to 1\); a joining "
        r"process takes one of ranks 2 to 3",
    ):
        join(fake, store, 1, 4)
    assert fake.calls("ncclCommGrow") == 0


def test_join_refuses_a_size_the_group_does_not_grow_to(fake):
    store = dist.HashStore()
    store.set(PLAN, "2 4")
    with pytest.raises(ValueError, match="size 5 differs from the 4 ranks the group grows to"):
        join(fake, store, 4, 5)


def test_join_refuses_a_rank_another_process_took(fake):
    store = dist.HashStore()
    store.set(PLAN, "2 4")
    store.add("nccl_core/grow/joined/3", 1)
    with pytest.raises(ValueError, match=r"rank 3 of group '.*' was taken by another joining"):
        join(fake, store, 3, 4)


def test_join_without_a_growing_group_ends_at_its_timeout(fake):
    start = time.monotonic()
    with pytest.raises(
        dist.DistBackendError, match=r"no group grew into group '.*' within the timeout \(200 ms\)"
    ):
        join(fake, dist.HashStore(), 2, 4, timeout_s=0.2)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("key", ["", None])
def test_grow_and_join_need_a_key(key):
    with pytest.raises(ValueError, match="key must be a non-empty string"):
        torch_nccl_core.join_group(4, 3, key)
    with pytest.raises(ValueError, match="key must be a non-empty string"):
        torch_nccl_core.grow_group(4, key)

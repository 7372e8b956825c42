"""How the ranks of a new communicator meet before NCCL initializes it
(csrc/backend/runtime/meetings.h): bounded by the group's timeout, naming the ranks that never
came, where NCCL's own bootstrap would wait for them for ever."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from threads import in_thread

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


def hash_stores(count: int) -> list:
    """One store that every rank's thread shares."""
    return [dist.HashStore()] * count


def tcp_stores(count: int) -> list:
    """A client each (one TCPStore client serves one call at a time), on one server."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeout = timedelta(seconds=30)
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timeout)
    return [server] + [
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout) for _ in range(count - 1)
    ]


STORES = {"hash": hash_stores, "tcp": tcp_stores}


def meet(stores, ranks, size: int, timeout_s: float, prefix: str = "init") -> dict:
    """Each of `ranks` meets on a thread of its own, through its store; rank -> its outcome and
    seconds taken."""
    start = time.monotonic()
    timeout = timedelta(seconds=timeout_s)
    running = {
        r: in_thread(lambda r=r: testing.rendezvous(stores[r], prefix, r, size, timeout))
        for r in ranks
    }
    outcomes = {}
    for r, (thread, outcome) in running.items():
        thread.join(timeout_s + 10.0)
        assert not thread.is_alive(), f"rank {r} still waiting"
        outcomes[r] = {**outcome, "s": time.monotonic() - start}
    return outcomes


@pytest.mark.parametrize("kind", STORES)
def test_every_rank_gets_rank_0s_unique_id(fake, kind):
    outcomes = meet(STORES[kind](4), range(4), 4, timeout_s=5.0)
    ids = [outcomes[r].get("result") for r in range(4)]
    assert ids[0] is not None and any(ids[0]), outcomes
    assert ids == [ids[0]] * 4, outcomes


@pytest.mark.parametrize("kind", STORES)
def test_a_rank_that_never_comes_is_named_once_the_timeout_passed(fake, kind):
    outcomes = meet(STORES[kind](4), [0, 1, 3], 4, timeout_s=0.5)
    for r in (0, 1, 3):
        error = outcomes[r].get("error")
        assert isinstance(error, dist.DistBackendError), outcomes[r]
        assert "rank(s) 2 of group 'g' did not come" in str(error), error
        assert "500 ms" in str(error), error
        assert 0.4 < outcomes[r]["s"] < 3.0, outcomes[r]


def test_a_later_meeting_under_another_prefix_gets_a_new_id(fake):
    stores = hash_stores(2)
    first = meet(stores, range(2), 2, timeout_s=5.0, prefix="a")
    second = meet(stores, range(2), 2, timeout_s=5.0, prefix="b")
    assert first[1]["result"] == first[0]["result"], first
    assert second[1]["result"] == second[0]["result"], second
    assert first[0]["result"] != second[0]["result"]


def test_a_rank_that_comes_after_the_others_gave_up_raises_too(fake):
    """Was: it found every other rank's key, took rank 0's id and entered NCCL's bootstrap,
    whose root waited for ranks that had left: a hang in a blocking initialization."""
    stores = hash_stores(3)
    given_up = meet(stores, [0, 1], 3, timeout_s=0.3)
    assert all(isinstance(o.get("error"), dist.DistBackendError) for o in given_up.values())
    late = meet(stores, [2], 3, timeout_s=5.0)[2]
    assert isinstance(late.get("error"), dist.DistBackendError), late
    assert "came after the other ranks had given up waiting for it" in str(late["error"])
    assert late["s"] < 2.0, late  # at once, not after its own timeout


def test_every_rank_gets_the_tally(fake):
    """The shrink's meeting: the ranks that stay (0, 2, 3 of 4) count whether they saw the group
    fail, and every one of them gets the same tally."""
    stores = hash_stores(4)
    failed = {0: 0, 2: 1, 3: 0}
    timeout = timedelta(seconds=5)
    stay = [0, 2, 3]
    running = {
        r: in_thread(lambda r=r: testing.meet(stores[r], "shrink", r, stay, failed[r], timeout))
        for r in failed
    }
    for r, (thread, outcome) in running.items():
        thread.join(10.0)
        assert outcome.get("result") == 1, (r, outcome)


def test_a_rank_whose_group_is_aborted_gives_the_meeting_up_for_everyone(fake):
    """abort() while a rank waits for a peer that never comes: it leaves at once (the meeting
    polls `abandon`), and so do the others, instead of each waiting out the 30 s timeout."""
    stores = hash_stores(3)
    aborted_at = time.monotonic() + 0.3
    timeout = timedelta(seconds=30)
    running = {
        0: in_thread(
            lambda: testing.rendezvous(
                stores[0], "init", 0, 3, timeout, abandon=lambda: time.monotonic() > aborted_at
            )
        ),
        1: in_thread(lambda: testing.rendezvous(stores[1], "init", 1, 3, timeout)),
    }
    for r, (thread, outcome) in running.items():
        thread.join(10.0)
        assert not thread.is_alive(), f"rank {r} still waiting"
        assert isinstance(outcome.get("error"), dist.DistBackendError), (r, outcome)
    assert "gave up waiting for rank(s) 1, 2: the group was aborted" in str(
        running[0][1]["error"]
    ) or "gave up waiting for rank(s) 2: the group was aborted" in str(running[0][1]["error"])
    assert "rank(s) 2 of group 'g' did not come, and another rank gave the meeting up" in str(
        running[1][1]["error"]
    )
    assert time.monotonic() - aborted_at < 5.0


def test_a_meeting_given_up_ends_the_waits_and_refuses_latecomers(fake):
    """What a rank that aborted a group tells the ranks meeting to finalize it (NCCL >= 2.32's
    finalize waits for every rank on the host): those waiting leave at once, and a rank that
    comes later is refused at once, instead of each waiting out the 30 s timeout."""
    stores = hash_stores(3)
    timeout = timedelta(seconds=30)
    waiting = in_thread(lambda: testing.meet(stores[0], "finalize", 0, [0, 1, 2], 0, timeout))
    time.sleep(0.3)
    start = time.monotonic()
    testing.give_up_meeting(stores[2], "finalize")
    late = in_thread(lambda: testing.meet(stores[1], "finalize", 1, [0, 1, 2], 0, timeout))
    for thread, outcome in (waiting, late):
        thread.join(10.0)
        assert not thread.is_alive()
        assert isinstance(outcome.get("error"), dist.DistBackendError), outcome
    assert "rank(s) 2 of group 'g' did not come, and another rank gave the meeting up" in str(
        waiting[1]["error"]
    )
    assert "rank(s) 2 of group 'g' did not come" in str(late[1]["error"])
    assert time.monotonic() - start < 5.0

"""Point-to-point: send/recv, isend/irecv, batch_isend_irecv, coalescing, refused peers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from .helpers import (
    COPY_DTYPES,
    WORLD_SIZE,
    assert_equal,
    assert_raised,
    assert_refused,
    dtype_cases,
    needs_ranks,
    poisoned,
    probe_group,
    raised_by,
    rank_tensor,
    require_dtype,
    ring_peers,
)

# (dtype, numel) of the tensors that batched exchanges move together
BATCH = [(torch.float32, 4097), (torch.int8, 1), (torch.bfloat16, 0), (torch.int64, 1023)]


def _ring_pair(
    rank: int, dtype: torch.dtype, numel: int
) -> tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(next, previous, sent, received, expected) of one tensor passed round the ring; skips
    dtypes the backend does not support."""
    require_dtype(dtype)
    after, before = ring_peers(rank)
    expected = rank_tensor(numel, dtype, before)
    received = poisoned(expected)
    return after, before, rank_tensor(numel, dtype, rank), received, expected


@needs_ranks(2)  # a rank's own send and recv are two calls that cannot meet
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(COPY_DTYPES))
def test_send_recv(rank, dtype, numel):
    after, before, mine, received, expected = _ring_pair(rank, dtype, numel)
    # even ranks send first, odd ranks receive first, so the ring never waits all the way round
    if rank % 2 == 0:
        dist.send(mine, dst=after)
        source = dist.recv(received, src=before)
    else:
        source = dist.recv(received, src=before)
        dist.send(mine, dst=after)
    assert source == before
    assert_equal(received, expected)


@needs_ranks(2)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(COPY_DTYPES))
def test_isend_irecv(rank, dtype, numel):
    after, before, mine, received, expected = _ring_pair(rank, dtype, numel)
    # opposite orders on even and odd ranks, so the ring never waits all the way round
    if rank % 2 == 0:
        works = [dist.isend(mine, dst=after), dist.irecv(received, src=before)]
    else:
        works = [dist.irecv(received, src=before), dist.isend(mine, dst=after)]
    for work in works:
        work.wait()
    assert_equal(received, expected)


def _ring_exchange(rank: int) -> tuple[list[dist.P2POp], list[torch.Tensor], list[torch.Tensor]]:
    """Sends to the next rank and receives from the previous one, one pair per BATCH entry."""
    after, before = ring_peers(rank)
    ops, received, expected = [], [], []
    for salt, (dtype, numel) in enumerate(BATCH):
        expected.append(rank_tensor(numel, dtype, before, salt=salt))
        received.append(poisoned(expected[-1]))
        ops.append(dist.P2POp(dist.isend, rank_tensor(numel, dtype, rank, salt=salt), after))
        ops.append(dist.P2POp(dist.irecv, received[-1], before))
    return ops, received, expected


def test_batch_isend_irecv_ring(rank):
    ops, received, expected = _ring_exchange(rank)
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for actual, want in zip(received, expected, strict=True):
        assert_equal(actual, want)


def test_coalescing_manager_p2p(rank, device):
    ops, received, expected = _ring_exchange(rank)
    with dist._coalescing_manager(device=device, async_ops=True) as cm:
        for op in ops:
            op.op(op.tensor, op.peer)
    cm.wait()
    for actual, want in zip(received, expected, strict=True):
        assert_equal(actual, want)


@pytest.mark.parametrize("direction", ["send", "recv"])
@pytest.mark.parametrize("peer", [WORLD_SIZE, -1], ids=["past-end", "negative"])
def test_peer_out_of_range_is_refused(fresh_group, direction, peer):
    # torch.distributed's own functions check peers first; the ProcessGroup reaches the backend
    call = getattr(fresh_group, direction)
    assert_refused(
        lambda: call([torch.ones(4, device="cuda")], peer, 0),
        ValueError,
        r"(?i)rank",
        group=fresh_group,
    )


def test_recv_from_self_is_refused(rank, fresh_group):
    assert_refused(
        lambda: dist.irecv(torch.ones(4, device="cuda"), src=rank, group=fresh_group),
        ValueError,
        r"(?i)rank|self",
        group=fresh_group,
    )


def test_recv_from_any_source_is_refused(fresh_group):
    assert_refused(
        lambda: dist.recv(torch.ones(4, device="cuda"), group=fresh_group),
        RuntimeError,
        group=fresh_group,
    )  # NotImplementedError is one


def test_refused_op_ends_its_coalescing_block(rank, device, fresh_group):
    """An op refused inside a coalescing block ends the block: the ops queued before it run, and
    the group takes ops again (was: every later batch raised "startCoalescing() called twice")."""
    after, before = ring_peers(rank)
    sent = rank_tensor(4097, torch.float32, rank)
    early = poisoned(rank_tensor(4097, torch.float32, before))

    def refused_inside_a_block():
        with dist._coalescing_manager(group=fresh_group, device=device, async_ops=True):
            dist.isend(sent, dst=after, group=fresh_group)
            dist.irecv(early, src=before, group=fresh_group)
            # the ProcessGroup method reaches the backend: torch's own functions check first
            fresh_group.send([sent], WORLD_SIZE, 0)

    error = raised_by(refused_inside_a_block)
    ops, received, expected = _ring_exchange(rank)
    ops = [dist.P2POp(op.op, op.tensor, op.peer, group=fresh_group) for op in ops]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    probe = probe_group(fresh_group)
    torch.cuda.synchronize()

    assert_raised(error, ValueError, r"(?i)rank")
    assert_equal(early, rank_tensor(4097, torch.float32, before))
    for actual, want in zip(received, expected, strict=True):
        assert_equal(actual, want)
    assert_equal(*probe)

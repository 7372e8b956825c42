"""Windows are peer memory. NCCL maps every rank's allocation for its peers and addresses a peer's
part of a window at this rank's own offset (and, before NCCL 2.30.7, maps it with this rank's
allocation size), so registration first exchanges every rank's part: a window NCCL would address
wrongly is refused on every rank alike, before NCCL is asked, and the group stays usable. Puts
and peer pointers are bounded by the target's part. Freeing window memory never waits for the
device on the host: it is released once the streams that used it are done.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core
from torch_nccl_core import WaitSignalDesc

from .helpers import (
    assert_equal,
    assert_raised,
    needs_ranks,
    one_sided_refused,
    probe_group,
    raised_by,
    rank_tensor,
    ring_peers,
)

NUMEL = 1 << 12
MIB = 1 << 20
FLOATS_PER_MIB = MIB // 4
SIGNAL_DELAY_S = 3.0  # how long the peer takes to send the signal a wait is left pending on


def _refused_alike(register, match: str) -> None:
    """`register` asks for a window NCCL would address wrongly: every rank raises the same
    ValueError, NCCL registered nothing, and the group still computes."""
    comm = torch_nccl_core.communicator()
    before = comm._resource_count()
    error = raised_by(register)
    after = comm._resource_count()
    probe = probe_group()
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, f"{type(error).__name__}: {error}")
    assert_raised(error, ValueError, match)
    assert len(set(messages)) == 1, messages
    assert after == before
    assert_equal(*probe)


@needs_ranks(2)  # one rank's part differs from rank 0's
def test_parts_at_different_offsets_are_refused_on_every_rank(rank, windows):
    """Was: accepted; each rank's puts landed 4096 bytes off in the peer's allocation, outside
    its window."""
    memory = torch_nccl_core.empty(2 * FLOATS_PER_MIB)
    start = 0 if rank == 0 else 4096 // 4  # an aligned view, 4096 bytes in
    part = memory[start : start + NUMEL]
    _refused_alike(
        lambda: torch_nccl_core.communicator().register_window(part),
        r"rank 1's part starts 4096 bytes into its NCCL allocation and rank 0's 0 bytes",
    )


@needs_ranks(2)  # one rank's part differs from rank 0's
def test_pool_blocks_at_different_offsets_are_refused(rank, windows):
    """Was: accepted; a block at offset 0 on one rank and 4 MiB on another let 1 MiB puts land
    outside the target's window."""
    pool = torch_nccl_core.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        filler = torch.empty(4 * FLOATS_PER_MIB, device="cuda") if rank > 0 else None  # noqa: F841
        block = torch.empty(4 * FLOATS_PER_MIB, device="cuda")  # 4 MiB further in on rank > 0
    _refused_alike(
        lambda: torch_nccl_core.communicator().register_window(block),
        r"rank 1's part starts \d+ bytes into its NCCL allocation and rank 0's 0 bytes",
    )


@needs_ranks(2)  # one rank's allocation differs from rank 0's
def test_allocations_of_different_sizes(rank, world_size, windows):
    """NCCL before 2.30.7 maps every peer's allocation with this rank's size: refused there.
    From 2.30.7 each rank's own size is mapped, and a put is bounded by its target's part."""
    memory = torch_nccl_core.empty((2 if rank == 0 else 6) * FLOATS_PER_MIB)
    part = memory[:NUMEL]
    comm = torch_nccl_core.communicator()
    if not torch_nccl_core.features()["window_sizes_per_rank"]:
        _refused_alike(lambda: comm.register_window(part), r"rank 1's part lies in an NCCL")
        return
    part.zero_()
    window = comm.register_window(part)
    peer, source = ring_peers(rank)
    if one_sided_refused(lambda: comm.put_signal(part[:4], peer, window)):
        return
    comm.put_signal(rank_tensor(NUMEL, torch.float32, rank), peer, window)
    comm.wait_signal(WaitSignalDesc(source))
    received = part.clone()
    torch.cuda.synchronize()
    dist.barrier()
    window.close()
    assert_equal(received, rank_tensor(NUMEL, torch.float32, source))


@needs_ranks(2)  # the put goes to another rank
def test_parts_inside_larger_allocations_take_puts_at_their_place(rank, windows):
    """Every rank's part is the second half of a 4 MiB allocation: a put lands in the target's
    part, at the target's offset, and nothing of the allocation around it changes."""
    memory = torch_nccl_core.empty(4 * FLOATS_PER_MIB)
    memory.fill_(-1.0)
    half = memory[2 * FLOATS_PER_MIB :]
    comm = torch_nccl_core.communicator()
    window = comm.register_window(half)
    peer, source = ring_peers(rank)
    src = rank_tensor(NUMEL, torch.float32, rank)
    if one_sided_refused(lambda: comm.put_signal(src, peer, window, offset=NUMEL)):
        return
    comm.put_signal(src, peer, window, offset=NUMEL)
    comm.wait_signal(WaitSignalDesc(source))
    contents = memory.clone()
    torch.cuda.synchronize()
    dist.barrier()
    window.close()
    expected = torch.full_like(contents, -1.0)
    start = 2 * FLOATS_PER_MIB + NUMEL
    expected[start : start + NUMEL] = rank_tensor(NUMEL, torch.float32, source)
    assert_equal(contents, expected)


@needs_ranks(2)  # the peer's part is smaller
def test_peer_pointers_are_bounded_by_the_peers_part(rank, windows):
    """Was: bounded by this rank's part, so an offset past the end of a smaller peer part got a
    pointer outside it. A multicast address reaches every part of the LSA team's members: bounded
    by the smallest of those."""
    memory = torch_nccl_core.empty((4 if rank == 0 else 2) * NUMEL)
    comm = torch_nccl_core.communicator()
    window = comm.register_window(memory)
    peer = 1 if rank == 0 else 0
    past_peer = raised_by(lambda: window.peer_pointer(peer, 3 * NUMEL * 4))
    inside_peer = raised_by(lambda: window.peer_pointer(peer, NUMEL * 4))
    past_multicast = raised_by(lambda: window.multimem_pointer(3 * NUMEL * 4))
    dist.barrier()
    window.close()
    if rank == 0:  # beyond rank 1's 2 * NUMEL floats, inside rank 0's own 4 * NUMEL
        assert_raised(past_peer, ValueError, r"past the end of rank 1's part \(32768 bytes\)")
    assert inside_peer is None, inside_peer
    if comm.lsa_size == comm.size or rank == 1:
        assert_raised(past_multicast, ValueError, r"past the end of rank 1's part \(32768 bytes\)")
    else:  # a team of its own (other nodes): inside rank 0's own part, no bound refuses it
        assert not isinstance(past_multicast, ValueError), past_multicast


BUSY_CYCLES = 2_000_000_000  # torch.cuda._sleep: about a second at an H200's clock


def test_freeing_window_memory_behind_busy_work_returns_at_once(rank, windows):
    """The stream that used a window's memory is still busy when the memory is dropped: the free
    returns with the work still running, and the memory and its window go once it is done.
    Was: the free synchronized the device first (on any transport: one-GPU worlds too)."""
    comm = torch_nccl_core.communicator()
    before = comm._resource_count()
    memory = torch_nccl_core.empty(NUMEL, window=True)
    window = comm.find_window(memory)
    memory.fill_(1.0)
    torch.cuda._sleep(BUSY_CYCLES)
    del memory
    busy_after_free = not torch.cuda.current_stream().query()
    open_after_free = window.is_valid
    torch.cuda.synchronize()
    dist.barrier()  # an op of the group: its thread releases what finished meanwhile
    closed = not window.is_valid
    after = comm._resource_count()
    assert busy_after_free  # the free did not wait for the device
    assert open_after_free  # released only once the stream was done
    assert closed and after == before


@needs_ranks(2)  # the signal comes from another rank
@pytest.mark.timeout(60, method="thread")
def test_freeing_window_memory_leaves_the_host_free(rank, windows):
    """Rank 0 drops a window's memory while a wait for a signal is pending on its stream: the
    free returns at once, and the memory goes back (its window closed) once the stream is done.
    Was: the free synchronized the device, so it returned only when the peer's signal came."""
    comm = torch_nccl_core.communicator()
    before = comm._resource_count()
    memory = torch_nccl_core.empty(NUMEL, window=True)
    window = comm.find_window(memory)
    if one_sided_refused(lambda: comm.signal((rank + 1) % dist.get_world_size())):
        return
    torch.cuda.synchronize()
    dist.barrier()
    freed_s = None
    if rank == 0:
        comm.wait_signal(WaitSignalDesc(1))  # rank 1 signals SIGNAL_DELAY_S from now
        start = time.monotonic()
        del memory
        freed_s = time.monotonic() - start
        open_while_waiting = window.is_valid
    else:
        if rank == 1:
            time.sleep(SIGNAL_DELAY_S)
            comm.signal(0)
        del memory
    torch.cuda.synchronize()
    dist.barrier()  # an op of the group: its thread releases what finished meanwhile
    closed = not window.is_valid
    after = comm._resource_count()
    probe = probe_group()
    if rank == 0:
        assert freed_s < 1.0, freed_s
        assert open_while_waiting  # released only once the wait was over
    assert closed
    assert after == before
    assert_equal(*probe)


@needs_ranks(2)  # the put goes to another rank
def test_a_put_in_flight_outlives_the_free_of_its_window(rank, windows):
    """Rank 0's put to rank 1, on a side stream held back by a busy kernel, goes through rank 0's
    mapping of the window: freeing rank 0's memory of that window on the main stream must not
    release the window (unmapping the peer) before the put finished."""
    numel = 16 * FLOATS_PER_MIB
    comm = torch_nccl_core.communicator()
    memory = torch_nccl_core.empty(numel, window=True)
    memory.zero_()
    window = comm.find_window(memory)
    src = rank_tensor(numel, torch.float32, rank)
    peer = 1 if rank == 0 else 0
    if one_sided_refused(lambda: comm.put_signal(src[:4], peer, window)):
        return
    torch.cuda.synchronize()
    dist.barrier()
    received = None
    if rank == 0:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s or more: the put starts after the free
        comm.put_signal(src, 1, window, stream=side)
        src.record_stream(side)
        del memory
        dist.barrier()  # an op of the group: it releases what the free queued, if done
        side.synchronize()
    elif rank == 1:
        comm.wait_signal(WaitSignalDesc(0))
        received = memory.clone()
        dist.barrier()
    else:
        dist.barrier()
    torch.cuda.synchronize()
    dist.barrier()
    probe = probe_group()
    if rank == 1:
        assert_equal(received, rank_tensor(numel, torch.float32, 0))
    assert_equal(*probe)

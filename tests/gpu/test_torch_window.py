"""torch's one-sided window API (torch >= 2.14: torch.distributed._new_window) on nccl_core."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    ASYNC_MODES,
    assert_equal,
    assert_raised,
    needs_ranks,
    raised_by,
    rank_tensor,
    ring_peers,
)

NUMEL = 4096

pytestmark = [
    pytest.mark.skipif(
        not hasattr(dist.distributed_c10d, "_new_window"),
        reason="torch's window API needs torch >= 2.14",
    ),
    needs_ranks(2),  # every call here targets another rank
]


def _window(group=None, numel: int = 2 * NUMEL, owning: bool = True):
    """A zeroed NCCL-memory tensor of this rank, registered with a new window of `group`."""
    buf = torch_nccl_core.empty(numel)
    buf.zero_()
    window = dist.distributed_c10d._new_window(group=group)
    window.tensor_register(buf, owning)  # collective
    return buf, window


@pytest.mark.parametrize("async_op", ASYNC_MODES)
def test_put_then_wait_signal_delivers_the_peers_data(rank, world_size, async_op, windows):
    buf, window = _window()
    peer, source = ring_peers(rank)
    src = rank_tensor(NUMEL, torch.float32, rank)  # ordinary CUDA memory
    put = window.put(src, peer, NUMEL, async_op)
    waited = window.wait_signal(source, async_op)
    put.wait()
    waited.wait()
    received = buf[NUMEL:].clone()
    untouched = buf[:NUMEL].clone()
    torch.cuda.synchronize()
    dist.barrier()
    # Every rank's puts landed: a peer's memory, read through its mapping, holds ours.
    remote = window.map_remote_tensor(peer)[NUMEL:].clone()
    attr = window.get_attr(peer)
    local = window.map_remote_tensor(rank)
    window.tensor_deregister()
    assert_equal(received, rank_tensor(NUMEL, torch.float32, source))
    assert_equal(untouched, torch.zeros(NUMEL, device="cuda"))
    assert_equal(remote, rank_tensor(NUMEL, torch.float32, rank))
    assert attr.access_type == torch._C._distributed_c10d.WindowAccessType.UNIFIED  # NVLink
    assert local.data_ptr() == buf.data_ptr()


def test_signals_count_and_order_puts(rank, world_size, windows):
    """Three puts, then three waits: each wait consumes one signal, all data is visible."""
    buf, window = _window(numel=4 * NUMEL)
    peer, source = ring_peers(rank)
    for k in range(3):
        window.put(rank_tensor(NUMEL, torch.float32, rank, salt=k), peer, k * NUMEL, False)
    for _ in range(3):
        window.wait_signal(source, False)
    window.signal(peer, False)  # a signal without data
    window.wait_signal(source, False)
    received = buf.clone()
    torch.cuda.synchronize()
    dist.barrier()
    window.tensor_deregister()
    expected = torch.cat(
        [rank_tensor(NUMEL, torch.float32, source, salt=k) for k in range(3)]
        + [torch.zeros(NUMEL, device="cuda")]
    )
    assert_equal(received, expected)


def _signal_inside_a_coalescing_block(window, peer, device):
    with dist._coalescing_manager(device=device, async_ops=True):
        window.signal(peer, False)


def test_window_refuses_bad_input_and_stays_usable(rank, world_size, device, windows):
    buf, window = _window()
    peer, source = ring_peers(rank)
    src = rank_tensor(NUMEL, torch.float32, rank)
    errors = []
    for call in (
        lambda: window.put(src, rank, 0, False),  # this rank
        lambda: window.put(src, world_size, 0, False),  # out of range
        lambda: window.put(src, peer, NUMEL + 1, False),  # overruns the peer's window
        lambda: window.put(src, peer, -1, False),
        lambda: window.put(src.cpu(), peer, 0, False),
        lambda: window.put(src[::2], peer, 0, False),  # not contiguous
        lambda: window.put(src.double(), peer, 0, False),  # not the window's dtype
        lambda: window.signal(-1, False),
        lambda: window.get_attr(world_size),
        lambda: window.tensor_register(buf),  # holds one already
    ):
        try:
            call()
            errors.append(None)
        except (ValueError, RuntimeError) as e:
            errors.append(e)
    # Ordinary CUDA memory is no NCCL memory: refused on every rank alike.
    with pytest.raises(ValueError, match="must lie in NCCL memory"):
        dist.distributed_c10d._new_window(torch.zeros(NUMEL, device="cuda"))
    in_block = raised_by(lambda: _signal_inside_a_coalescing_block(window, peer, device))
    window.put(src, peer, NUMEL, False)
    window.wait_signal(source, False)
    received = buf[NUMEL:].clone()
    torch.cuda.synchronize()
    dist.barrier()
    window.tensor_deregister()
    assert all(isinstance(e, ValueError) for e in errors[:-1]), errors
    assert isinstance(errors[-1], RuntimeError) and "tensor_deregister first" in str(errors[-1])
    assert_raised(in_block, RuntimeError, "cannot run inside a coalescing block")
    assert_equal(received, rank_tensor(NUMEL, torch.float32, source))


@pytest.mark.timeout(90, method="thread")
def test_a_cpu_tensor_on_one_rank_is_refused_on_every_rank(rank, world_size, windows):
    """tensor_register is collective: rank 0's CPU tensor is refused within the exchange every
    rank joins, so the others raise at once too rather than waiting out the timeout; a window
    registered next works."""
    good = torch_nccl_core.empty(NUMEL)
    window = dist.distributed_c10d._new_window()
    start = time.monotonic()
    error = raised_by(lambda: window.tensor_register(good.cpu() if rank == 0 else good))
    elapsed = time.monotonic() - start
    buf, usable = _window()
    peer, source = ring_peers(rank)
    usable.put(rank_tensor(NUMEL, torch.float32, rank), peer, 0, False)
    usable.wait_signal(source, False)
    received = buf[:NUMEL].clone()
    torch.cuda.synchronize()
    dist.barrier()
    usable.tensor_deregister()
    assert_raised(error, ValueError, "CUDA" if rank == 0 else "rank 0 refused")
    assert elapsed < 10.0, elapsed
    assert_equal(received, rank_tensor(NUMEL, torch.float32, source))


@pytest.mark.timeout(90, method="thread")
def test_a_wait_no_signal_meets_fails_at_the_timeout_naming_it(rank, world_size, windows):
    group = dist.new_group(backend="nccl_core", timeout=timedelta(seconds=3))
    _, window = _window(group)
    start = time.monotonic()
    error = None
    if rank == 0:
        work = window.wait_signal(world_size - 1, True)  # the last rank never signals
        try:
            work.wait(timedelta(seconds=30))
        except Exception as e:  # DistBackendError
            error = e
    elapsed = time.monotonic() - start
    dist.barrier()  # the default group: the other ranks wait here for rank 0's verdict
    dist.destroy_process_group(group)
    if rank == 0:
        assert isinstance(error, dist.DistBackendError), error
        assert "wait_signal" in str(error), error
        assert elapsed < 3 + 5, elapsed


@pytest.mark.timeout(90, method="thread")
def test_destroy_ends_an_async_wait_rather_than_waiting_out_the_timeout(rank, world_size, windows):
    """Like a synchronous one, an async wait for a signal that may never come does not hold
    destroy for the group's timeout (60 s here)."""
    group = dist.new_group(backend="nccl_core", timeout=timedelta(seconds=60))
    _, window = _window(group)
    work = window.wait_signal((rank + 1) % world_size, True)  # nobody signals
    start = time.monotonic()
    dist.destroy_process_group(group)
    elapsed = time.monotonic() - start
    completed = work.is_completed()
    assert elapsed < 10, elapsed
    assert completed and not work.is_success()

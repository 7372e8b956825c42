"""One-sided operations: put_signal, signal and wait_signal on windows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core
from torch_nccl_core import WaitSignalDesc, WindowFlag

from .helpers import (
    assert_equal,
    assert_raised,
    load_store_reachable,
    needs_ranks,
    one_sided_refused,
    probe_group,
    raised_by,
    rank_tensor,
    ring_peers,
    window_refusal,
)

NUMEL = 4096


def _window(numel: int = 4 * NUMEL, flags: WindowFlag = WindowFlag.DEFAULT):
    buf = torch_nccl_core.empty(numel, window=True, window_flags=flags)
    buf.zero_()
    torch.cuda.synchronize()
    dist.barrier()
    return buf, torch_nccl_core.communicator().find_window(buf)


@needs_ranks(2)  # one-sided ops go to another rank
@pytest.mark.parametrize("stream_kind", ["current", "torch", "int", "protocol"])
def test_put_signal_ring(rank, world_size, stream_kind, windows):
    comm = torch_nccl_core.communicator()
    buf, window = _window()
    peer, source = ring_peers(rank)
    side = torch.cuda.Stream()
    stream = {
        "current": None,
        "torch": side,
        "int": side.cuda_stream,
        "protocol": type("S", (), {"__cuda_stream__": lambda self: (0, side.cuda_stream)})(),
    }[stream_kind]
    src = rank_tensor(NUMEL, torch.float32, rank)
    if stream_kind != "current":
        side.wait_stream(torch.cuda.current_stream())
    if one_sided_refused(lambda: comm.put_signal(src, peer, window, offset=NUMEL, stream=stream)):
        return
    comm.put_signal(src, peer, window, offset=NUMEL, stream=stream)
    comm.wait_signal(WaitSignalDesc(source), stream=stream)
    if stream_kind != "current":
        torch.cuda.current_stream().wait_stream(side)
    received = buf[NUMEL : 2 * NUMEL].clone()
    untouched = buf[:NUMEL].clone()
    torch.cuda.synchronize()
    dist.barrier()
    assert_equal(received, rank_tensor(NUMEL, torch.float32, source))
    assert_equal(untouched, torch.zeros(NUMEL, device="cuda"))


@needs_ranks(2)  # one-sided ops go to another rank
@pytest.mark.parametrize("flags", [WindowFlag.DEFAULT, WindowFlag.COLL_SYMMETRIC])
def test_put_signal_from_window_memory(rank, world_size, flags, windows):
    """A source inside a window lands too (NCCL >= 2.29 reads symmetric ones in place)."""
    comm = torch_nccl_core.communicator()
    buf, window = _window(flags=flags)
    peer, source = ring_peers(rank)
    buf[:NUMEL].copy_(rank_tensor(NUMEL, torch.float32, rank))
    if one_sided_refused(lambda: comm.put_signal(buf[:NUMEL], peer, window, offset=NUMEL)):
        return
    comm.put_signal(buf[:NUMEL], peer, window, offset=NUMEL)
    comm.wait_signal(WaitSignalDesc(source))
    received = buf[NUMEL : 2 * NUMEL].clone()
    torch.cuda.synchronize()
    dist.barrier()
    assert_equal(received, rank_tensor(NUMEL, torch.float32, source))


@needs_ranks(2)  # one-sided ops go to another rank
def test_signals_count(rank, world_size, windows):
    """Several puts, one wait of op_count=n; then waits in a loop."""
    comm = torch_nccl_core.communicator()
    buf, window = _window()
    peer, source = ring_peers(rank)
    if one_sided_refused(lambda: comm.signal(peer)):
        return
    parts = 4
    for i in range(parts):
        chunk = rank_tensor(NUMEL // parts, torch.float32, rank, salt=i)
        comm.put_signal(chunk, peer, window, offset=i * (NUMEL // parts))
    comm.wait_signal([WaitSignalDesc(source, op_count=parts)])
    first = buf[:NUMEL].clone()
    for _ in range(10):
        comm.signal(peer)
        comm.wait_signal(WaitSignalDesc(source))
    torch.cuda.synchronize()
    dist.barrier()
    expected = torch.cat(
        [rank_tensor(NUMEL // parts, torch.float32, source, salt=i) for i in range(parts)]
    )
    assert_equal(first, expected)


@needs_ranks(2)  # one-sided ops go to another rank
def test_one_sided_refuses_bad_input(rank, world_size, windows):
    comm = torch_nccl_core.communicator()
    _buf, window = _window(NUMEL)  # _buf keeps the window's memory alive
    peer = (rank + 1) % world_size
    src = torch.ones(NUMEL, device="cuda")
    with pytest.raises(ValueError, match="another rank"):
        comm.put_signal(src, rank, window)
    with pytest.raises(ValueError, match="another rank"):
        comm.signal(world_size)
    for offset in (1, -1, 2**62):  # 2**62 elements: the byte offset would wrap around
        with pytest.raises(ValueError, match="do not fit in the window"):
            comm.put_signal(src, peer, window, offset=offset)
    with pytest.raises(ValueError, match="must be 0"):
        comm.put_signal(src[:4], peer, window, signal_index=1)
    with pytest.raises(ValueError, match="contiguous"):
        comm.put_signal(torch.ones(8, 8, device="cuda").t(), peer, window)
    with pytest.raises(ValueError, match="CUDA"):
        comm.put_signal(torch.ones(4), peer, window)
    with pytest.raises(TypeError, match="stream"):
        comm.signal(peer, stream="fast")
    # a stream of another GPU, as an object and as a raw handle (ranks may share the one GPU)
    if torch.cuda.device_count() > 1:
        other = (comm.device + 1) % torch.cuda.device_count()
        other_device = torch.cuda.Stream(device=other)
        for foreign in (other_device, other_device.cuda_stream):
            with pytest.raises(ValueError, match=f"belongs to cuda:{other}"):
                comm.signal(peer, stream=foreign)
    for count in (0, 2**32):
        with pytest.raises(ValueError, match="op_count"):
            WaitSignalDesc(peer, op_count=count)
    with pytest.raises(ValueError, match="op_count"):
        torch.ops.nccl_core.wait_signal(_buf, [peer], [2**32], dist.group.WORLD.group_name)
    with pytest.raises(ValueError, match="do not fit in the window"):
        torch.ops.nccl_core.put_signal(src, _buf, peer, 2**62, dist.group.WORLD.group_name)
    dist.barrier()
    window.close()
    with pytest.raises(RuntimeError, match="was closed"):
        comm.put_signal(src[:4], peer, window)


@needs_ranks(2)  # one-sided ops go to another rank
def test_window_of_another_group_is_refused(rank, world_size, windows):
    group = dist.new_group(backend="nccl_core")
    memory = torch_nccl_core.empty(NUMEL, group=group, window=True)
    other = torch_nccl_core.communicator(group).find_window(memory)
    with pytest.raises(ValueError, match="another communicator"):
        torch_nccl_core.communicator().put_signal(memory[:4], (rank + 1) % world_size, other)
    dist.barrier()
    del memory, other
    dist.destroy_process_group(group)


def _gin_reaches_peers(comm) -> bool:
    """Whether GPU-initiated networking serves this communicator (NCCL >= 2.29 can tell)."""
    if torch_nccl_core.nccl_version() < (2, 29, 0):
        return False
    try:
        return comm.gin_type != torch_nccl_core.GinType.NONE
    except NotImplementedError:  # built against NCCL 2.28's headers: it cannot tell either
        return False


def _dev_comm_refused(comm) -> bool:
    """Across nodes without GIN a device communicator is refused, naming why, before NCCL is
    asked (NCCL's own refusal left the communicator unfit for window registrations): True then,
    after checking that the group still registers windows (where NCCL gives it any) and
    computes."""
    if load_store_reachable() or _gin_reaches_peers(comm):
        return False
    error = raised_by(
        lambda: comm.create_dev_comm(torch_nccl_core.DevCommRequirements(lsa_barrier_count=1))
    )
    windows = window_refusal() is None
    window_memory = torch_nccl_core.empty(NUMEL, window=windows)
    window_memory.fill_(1.0)
    dist.all_reduce(window_memory)
    probe = probe_group()
    assert_raised(error, NotImplementedError, "not load/store reachable")
    assert_equal(window_memory, torch.full_like(window_memory, float(dist.get_world_size())))
    assert_equal(*probe)
    return True


def test_dev_comm_lifecycle(rank, world_size):
    comm = torch_nccl_core.communicator()
    if _dev_comm_refused(comm):
        return
    dev = comm.create_dev_comm(torch_nccl_core.DevCommRequirements(lsa_barrier_count=1))
    default = comm.create_dev_comm()
    info = (dev.ptr != 0, dev.lsa_rank, dev.lsa_size, dev.is_valid)
    dev.close()
    dev.close()
    assert info == (True, rank, world_size, True)
    assert not dev.is_valid
    assert default.is_valid  # closing one leaves the other
    with pytest.raises(RuntimeError, match="was closed"):
        dev.ptr  # noqa: B018
    with pytest.raises(TypeError, match="DevCommRequirements"):
        comm.create_dev_comm({"lsa_barrier_count": 1})
    with pytest.raises(ValueError, match="lsa_barrier_count"):
        comm.create_dev_comm(torch_nccl_core.DevCommRequirements(lsa_barrier_count=2**32))
    default.close()


def test_gin_type_by_nccl_version():
    """NCCL >= 2.29 reports the GIN transport (the suite builds against the runtime's headers)."""
    comm = torch_nccl_core.communicator()
    if torch_nccl_core.nccl_version() >= (2, 29, 0):
        assert isinstance(comm.gin_type, torch_nccl_core.GinType)
        assert isinstance(comm.railed_gin_type, torch_nccl_core.GinType)
    else:
        with pytest.raises(NotImplementedError, match=r"2\.29"):
            comm.gin_type  # noqa: B018


def test_device_kernel_example_exchanges_through_lsa(rank, world_size):
    """examples/device_kernel: a kernel that exchanges data itself, with an LSA barrier."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples/device_kernel"))
    from build import build

    if _dev_comm_refused(torch_nccl_core.communicator()):
        return
    module = build()  # both ranks: torch's build lock serialises the compile
    dist.barrier()
    comm = torch_nccl_core.communicator()
    count = 1 << 14
    buf = torch_nccl_core.empty(2 * count, window=True)
    buf[:count].fill_(rank)
    buf[count:].fill_(-1)
    window = comm.find_window(buf)
    dev = comm.create_dev_comm(torch_nccl_core.DevCommRequirements(lsa_barrier_count=1))
    module.exchange(dev.ptr, window.handle, count, torch.cuda.current_stream().cuda_stream)
    received = buf[count:].clone()
    torch.cuda.synchronize()
    dev.close()
    dist.barrier()
    assert torch.all(received == float((rank + 1) % world_size))

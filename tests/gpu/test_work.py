"""Work semantics: stream ordering, polling, futures, and lifetime of in-flight tensors.

Several tests hold the last rank's GPU in a sleep kernel before the collective: its NCCL kernel
then starts late, which keeps the op in flight on every rank long enough for a missing stream
dependency or an early free to show up as wrong data rather than as luck.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from .helpers import all_ranks, assert_equal, concat, poisoned, rank_tensor, reference_reduce

SLEEP_CYCLES = 400_000_000  # about 0.2 s of GPU clock
DTYPE = torch.float32
BIG = 1 << 24  # 64 MiB of float32


def _delay_last_rank(rank: int) -> None:
    """Line the hosts up, then hold the last rank's current stream for a while."""
    dist.barrier()
    if rank == dist.get_world_size() - 1:
        torch.cuda._sleep(SLEEP_CYCLES)


def test_wait_orders_the_current_stream(rank):
    tensor = rank_tensor(BIG, DTYPE, rank)
    expected = reference_reduce(all_ranks(BIG, DTYPE), "sum")
    _delay_last_rank(rank)
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    snapshot = tensor.clone()  # on the current stream, no host synchronisation in between
    assert_equal(snapshot, expected)


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs a second GPU to make current instead"
)
def test_wait_orders_the_ops_device_whatever_device_is_current(rank):
    """Programs that never call set_device run ops on cuda:rank while cuda:0 is current. The
    default stream's handle names the current device's, so a wait() issued there must still
    order the op's device (was: the other device's stream waited, and DDP's parameter check
    read a peer's count as 0)."""
    tensor = rank_tensor(BIG, DTYPE, rank)
    expected = reference_reduce(all_ranks(BIG, DTYPE), "sum")
    _delay_last_rank(rank)
    other = (tensor.device.index + 1) % torch.cuda.device_count()
    with torch.cuda.device(other):
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()
        snapshot = tensor.clone()  # on the tensor's device's current stream
    assert_equal(snapshot, expected)


def test_is_completed_polls_without_blocking(rank):
    tensor = rank_tensor(1023, DTYPE, rank)
    expected = reference_reduce(all_ranks(1023, DTYPE), "sum")
    torch.cuda._sleep(SLEEP_CYCLES)  # this rank's op cannot finish before the sleep does
    work = dist.all_reduce(tensor, async_op=True)
    start = time.monotonic()
    first = work.is_completed()
    first_call_s = time.monotonic() - start
    deadline = start + 30
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    completed = work.is_completed()
    work.wait()
    assert first is False, "is_completed() was True while the op was still queued"
    assert first_call_s < 0.05, f"is_completed() blocked for {first_call_s:.3f}s"
    assert completed, "is_completed() never became True"
    assert_equal(tensor, expected)


def test_future_holds_the_outputs(rank):
    tensor = rank_tensor(1023, DTYPE, rank)
    everyone = all_ranks(1023, DTYPE)
    gathered = poisoned(concat(everyone))
    reduce_future = dist.all_reduce(tensor, async_op=True).get_future()
    gather_input = rank_tensor(1023, DTYPE, rank)  # not `tensor`: the all_reduce may be writing it
    gather_future = dist.all_gather_into_tensor(gathered, gather_input, async_op=True).get_future()
    reduced_out = reduce_future.wait()
    gathered_out = gather_future.wait()
    assert [t.data_ptr() for t in reduced_out] == [tensor.data_ptr()]
    assert [t.data_ptr() for t in gathered_out] == [gathered.data_ptr()]
    assert_equal(reduced_out[0], reference_reduce(everyone, "sum"))
    assert_equal(gathered_out[0], concat(everyone))


def test_future_then_runs_after_the_op(rank):
    tensor = rank_tensor(BIG, DTYPE, rank)
    doubled_expected = reference_reduce(all_ranks(BIG, DTYPE), "sum") * 2
    _delay_last_rank(rank)
    work = dist.all_reduce(tensor, async_op=True)
    doubled = work.get_future().then(lambda future: future.value()[0] * 2).wait()
    assert work.wait(timeout=timedelta(seconds=30))
    assert_equal(doubled, doubled_expected)


def _all_gather_dropping_input(rank: int, output: torch.Tensor) -> dist.Work:
    # the input's last Python reference dies with this frame, while the op is in flight
    return dist.all_gather_into_tensor(output, rank_tensor(BIG, DTYPE, rank), async_op=True)


def _all_reduce_and_forget(rank: int) -> None:
    # neither the tensor nor the Work outlives this frame
    dist.all_reduce(rank_tensor(BIG, DTYPE, rank), async_op=True)


def _scribble() -> list[torch.Tensor]:
    """Allocations that would reuse any block freed too early, and overwrite it."""
    return [torch.full((BIG,), -1.0, device="cuda") for _ in range(4)]


def test_input_outlives_its_python_reference(rank):
    expected = concat(all_ranks(BIG, DTYPE))
    output = poisoned(expected)
    _delay_last_rank(rank)
    work = _all_gather_dropping_input(rank, output)
    scribbles = _scribble()
    work.wait()
    assert_equal(output, expected)
    assert all(bool(s.eq(-1).all()) for s in scribbles), "the collective wrote into reused memory"


def test_forgotten_async_op_does_not_write_into_reused_memory(rank):
    _delay_last_rank(rank)
    _all_reduce_and_forget(rank)
    scribbles = _scribble()
    torch.cuda.synchronize()  # every stream, the backend's included
    assert all(bool(s.eq(-1).all()) for s in scribbles), "the collective wrote into reused memory"


def test_sync_op_returns_a_usable_work(rank):
    tensor = rank_tensor(1023, DTYPE, rank)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    options.asyncOp = False
    work = dist.group.WORLD.allreduce([tensor], options)
    assert work.wait()
    result = work.get_future().wait()
    assert [t.data_ptr() for t in result] == [tensor.data_ptr()]
    assert_equal(tensor, reference_reduce(all_ranks(1023, DTYPE), "sum"))


def _timed_group(monkeypatch) -> dist.ProcessGroup:
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")  # read as the group is made
    return dist.new_group(list(range(dist.get_world_size())), backend="nccl_core")


def test_get_duration_times_async_sync_and_coalesced_ops(rank, monkeypatch):
    group = _timed_group(monkeypatch)
    tensor = rank_tensor(BIG, DTYPE, rank)
    async_work = dist.all_reduce(tensor, group=group, async_op=True)
    sync_options = dist.AllreduceOptions()
    sync_options.asyncOp = False
    sync_work = group.allreduce([tensor], sync_options)
    blocks = []
    # Without a device torch issues one allreduce_coalesced; with one, an NCCL group
    # between startCoalescing and endCoalescing.
    for device in (None, torch.device("cuda", torch.cuda.current_device())):
        with dist._coalescing_manager(group=group, device=device, async_ops=True) as block:
            dist.all_reduce(tensor, group=group)
            dist.all_reduce(tensor, group=group)
        block.wait()
        blocks.append(block)
    async_work.wait()
    torch.cuda.synchronize()
    works = [async_work, sync_work, *(w for block in blocks for w in block.works)]
    durations = [w._get_duration() for w in works]
    dist.destroy_process_group(group)
    assert len(durations) == 4
    # 64 MiB over NVLink: well above a microsecond, well below a second.
    assert all(1e-3 < ms < 1e3 for ms in durations), durations


def test_get_duration_without_timing_says_how_to_enable_it(rank):
    work = dist.all_reduce(rank_tensor(1023, DTYPE, rank), async_op=True)
    work.wait()
    torch.cuda.synchronize()
    try:
        work._get_duration()
        error = None
    except RuntimeError as e:
        error = str(e)
    assert error is not None and "TORCH_NCCL_ENABLE_TIMING=1" in error

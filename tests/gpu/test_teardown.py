"""Teardown in every order: resources, pools and tensors outliving their group, and exit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    SWEEP_NUMEL,
    all_ranks,
    assert_equal,
    needs_ranks,
    one_sided_refused,
    rank_tensor,
    reference_reduce,
    window_refusal,
)

CLOSED = "was closed"


@needs_ranks(2)  # waits on another rank's signal
@pytest.mark.timeout(60, method="thread")
def test_destroying_the_group_ends_a_wait_no_signal_meets(rank, world_size):
    """A load_store wait spins on the device until its signal; an abort must end it, not hang."""
    if torch_nccl_core.one_sided_engine() != "load_store":
        pytest.skip("NCCL's own engine ends its waits itself")  # same on both ranks
    group = dist.new_group(backend="nccl_core")
    memory = torch_nccl_core.empty(SWEEP_NUMEL, group=group, window=True)
    side = torch.cuda.Stream()
    waiter = torch_nccl_core.communicator(group)
    desc = torch_nccl_core.WaitSignalDesc((rank + 1) % world_size)
    if one_sided_refused(lambda: waiter.wait_signal(desc, stream=side), group):
        dist.destroy_process_group(group)
        return
    waiter.wait_signal(desc, stream=side)
    dist.destroy_process_group(group)
    side.synchronize()  # returns: the aborted wait gave up
    del memory
    gc.collect()
    assert waiter.is_aborted


def test_destroying_the_group_closes_its_resources(rank):
    """A window (where NCCL gives the group windows), a registered buffer, a custom op."""
    group = dist.new_group(backend="nccl_core")
    comm = torch_nccl_core.communicator(group)
    windowed, closers, calls = None, [], []
    if window_refusal(group) is None:
        windowed = torch_nccl_core.empty(SWEEP_NUMEL, group=group, window=True)
        window = comm.find_window(windowed)
        closers.append(window)
        calls.append(lambda: window.handle)
    buffer = comm.register_buffer(torch.ones(SWEEP_NUMEL, device="cuda"))
    op = comm.create_pre_mul_sum(3.0, torch.float32)
    dist.destroy_process_group(group)
    valid = [resource.is_valid for resource in [*closers, buffer, op]]
    del windowed  # freeing memory whose window died with the group
    gc.collect()
    for window in closers:
        window.close()  # closing after the group is gone is a no-op
    assert not any(valid), valid
    assert comm.is_aborted
    for call in (*calls, lambda: buffer.handle, lambda: op.op):
        try:
            call()
        except RuntimeError as error:
            assert CLOSED in str(error)
        else:
            raise AssertionError("a closed resource answered")


def test_pool_outlives_its_group(rank):
    """The case that crashes the built-in backend: MemPool freed after its group is gone."""
    group = dist.new_group(backend="nccl_core")
    pool = torch_nccl_core.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        t = rank_tensor(1 << 20, torch.float32, rank)
    dist.all_reduce(t, group=group)  # registers the pool's segment with the group
    result = t.clone()
    dist.destroy_process_group(group)
    del t, pool
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    assert_equal(result, reference_reduce(all_ranks(1 << 20, torch.float32), "sum"))


def test_group_destroyed_with_ops_in_flight(rank, world_size):
    group = dist.new_group(backend="nccl_core")
    t = torch_nccl_core.empty(16 << 20, dtype=torch.int32)  # 64 MiB, and no sum wraps
    t.fill_(rank + 1)
    works = [dist.all_reduce(t, group=group, async_op=True) for _ in range(4)]
    dist.destroy_process_group(group)  # waits for the enqueued work, then frees the comm
    del works
    torch.cuda.synchronize()
    # the sum of 1..world_size after the first op, then world_size times that, three times
    first = world_size * (world_size + 1) // 2
    assert t.view(-1)[0].item() == first * world_size**3


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist, torch_nccl_core
    store = dist.FileStore(sys.argv[1], 1)
    dist.init_process_group("nccl_core", store=store, rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    pool = torch_nccl_core.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        pooled = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(pooled)
    windowed = torch_nccl_core.empty(1 << 20, window=True)
    dist.all_reduce(windowed)
    comm = torch_nccl_core.communicator()
    kept = comm.register_buffer(torch_nccl_core.empty(4096))
    if sys.argv[2] == "destroy":
        dist.destroy_process_group()
    print("exiting", flush=True)
    """
)


def test_interpreter_exit_with_live_nccl_tensors_and_windows(rank, tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(torch.cuda.current_device()))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    outcomes = {}
    for mode in ("keep", "destroy"):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path / f"store-{mode}"), mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        outcomes[mode] = done
    for mode, done in outcomes.items():
        assert done.returncode == 0, f"{mode}: rc {done.returncode}\n{done.stderr[-3000:]}"
        assert "exiting" in done.stdout
        assert "terminate" not in done.stderr and "Segmentation" not in done.stderr

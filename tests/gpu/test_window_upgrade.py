"""Options(window_upgrade=True): buffers an all_reduce or reduce_scatter_tensor runs on a third
time, at sizes where NCCL's symmetric kernels were measured faster, become symmetric windows of
the group where every rank can: tensors of torch_nccl_core.empty, never memory that other tensors
get after them (csrc/backend/routing/window_upgrade.h).

Where the ranks are not load/store reachable (ranks sharing a GPU as nodes, other nodes) NCCL
runs no symmetric kernels: nothing is upgraded, and results are the same.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    all_ranks,
    assert_equal,
    load_store_reachable,
    new_core_group,
    owned_group,
    profiled_kernels,
    rank_tensor,
    reference_reduce,
    window_refusal,
)

NUMEL = 1 << 20  # 4 MiB of float32: symmetric kernels win from 2 to 64 MiB
RUNS = 5


@pytest.fixture
def upgrading(_distributed):
    # A short timeout: a vote or window registration gone wrong ends in seconds, not a hang.
    yield from owned_group(
        new_core_group(
            window_upgrade=True,
            register_caching_allocator=True,
            # NCCL's all_reduces and reduce_scatters are what the upgrade is for
            all_reduce_kernels="off",
            gather_scatter_kernels=False,
            timeout=timedelta(seconds=30),
        )
    )


def _upgrades(group) -> bool:
    """Whether this world upgrades at all: NCCL gives the group windows and symmetric kernels."""
    return load_store_reachable(group) and window_refusal(group) is None


def _all_reduce_runs(group, make, rank: int, runs: int = RUNS) -> list[torch.Tensor]:
    """`runs` all_reduces, each on the buffer `make(run)` gives, each checked."""
    expected = reference_reduce(all_ranks(NUMEL, torch.float32), "sum")
    buffers = []
    for run in range(runs):
        x = make(run)
        x.copy_(rank_tensor(NUMEL, torch.float32, rank))
        dist.all_reduce(x, group=group)
        assert_equal(x, expected)
        buffers.append(x)
    return buffers


def _same_on_every_rank(value: int, group) -> None:
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    assert len(set(values)) == 1, values


def test_a_tensor_of_nccl_memory_run_again_becomes_a_window_and_results_stay_right(rank, upgrading):
    x = torch_nccl_core.empty(NUMEL, dtype=torch.float32)

    def run_once():
        x.copy_(rank_tensor(NUMEL, torch.float32, rank))
        dist.all_reduce(x, group=upgrading)

    before = profiled_kernels(run_once)
    _all_reduce_runs(upgrading, lambda run: x, rank, runs=RUNS)
    after = profiled_kernels(run_once)
    stats = torch_nccl_core.registration_stats(upgrading)
    window = torch_nccl_core.communicator(upgrading).find_window(x)
    if _upgrades(upgrading):
        assert stats["upgraded_windows"] == 1
        assert stats["upgraded_window_bytes"] == x.nbytes
        assert window is not None and window.size == x.nbytes
        # NCCL chose other kernels once the buffer was a window: its symmetric ones.
        assert before != after, (before, after)
    else:
        assert stats["upgraded_windows"] == 0 and window is None


@pytest.mark.parametrize("allocator", ["cuda_malloc", "mem_pool", "expandable_segments"])
def test_memory_other_tensors_get_after_this_one_is_never_a_window(rank, upgrading, allocator):
    """A pool's segments and torch's hand a freed tensor's range to other tensors, maybe
    differently on each rank: every rank votes no, and results stay right."""
    pool = torch_nccl_core.mem_pool()
    torch.cuda.empty_cache()  # a fresh segment of the allocator under test
    if allocator == "expandable_segments":
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        if allocator == "mem_pool":
            with torch.cuda.use_mem_pool(pool):
                x = torch.empty(NUMEL, dtype=torch.float32, device="cuda")
        else:
            x = torch.empty(NUMEL, dtype=torch.float32, device="cuda")
        _all_reduce_runs(upgrading, lambda run: x, rank)
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    assert torch_nccl_core.registration_stats(upgrading)["upgraded_windows"] == 0
    assert torch_nccl_core.communicator(upgrading).find_window(x) is None


def test_a_rank_with_other_buffers_keeps_every_rank_from_upgrading(rank, upgrading):
    """Rank 0 runs on one buffer, the others on a new one each run: only rank 0 could upgrade,
    and a window registered by it alone would hang; the vote keeps every rank from it."""
    kept = torch_nccl_core.empty(NUMEL, dtype=torch.float32)
    _all_reduce_runs(
        upgrading,
        lambda run: kept if rank == 0 else torch_nccl_core.empty(NUMEL, dtype=torch.float32),
        rank,
    )
    assert torch_nccl_core.registration_stats(upgrading)["upgraded_windows"] == 0


def test_reduce_scatter_buffers_become_windows_and_results_stay_right(rank, world_size, upgrading):
    output = torch_nccl_core.empty(NUMEL, dtype=torch.float32)
    input = torch_nccl_core.empty(NUMEL * world_size, dtype=torch.float32)
    full = reference_reduce(all_ranks(NUMEL * world_size, torch.float32), "sum")
    for _ in range(RUNS):
        input.copy_(rank_tensor(NUMEL * world_size, torch.float32, rank))
        dist.reduce_scatter_tensor(output, input, group=upgrading)
        assert_equal(output, full.view(world_size, NUMEL)[rank])
    stats = torch_nccl_core.registration_stats(upgrading)
    _same_on_every_rank(stats["upgraded_windows"], upgrading)
    assert stats["upgraded_windows"] == (2 if _upgrades(upgrading) else 0)

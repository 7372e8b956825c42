"""Automatic registration of NCCL memory, and the backend's communication-buffer allocator."""

from __future__ import annotations

import gc
import os
import time

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    SWEEP_NUMEL,
    all_ranks,
    assert_equal,
    concat,
    poisoned,
    rank_tensor,
    reference_reduce,
)

ALLOCATORS = ["empty", "mem_pool", "allocate_tensor"]


def _nccl_tensor(kind: str, numel: int, pool, group=None) -> torch.Tensor:
    if kind == "empty":
        return torch_nccl_core.empty(numel, dtype=torch.float32)
    if kind == "mem_pool":
        with torch.cuda.use_mem_pool(pool):
            return torch.empty(numel, dtype=torch.float32, device="cuda")
    backend = (group or dist.group.WORLD)._get_backend(torch.device("cuda"))
    return backend.allocate_tensor(numel, dtype=torch.float32, device=torch.device("cuda"))


@pytest.mark.parametrize("kind", ALLOCATORS)
def test_ops_on_nccl_memory_register_once_and_are_right(rank, world_size, kind, fresh_group):
    pool = torch_nccl_core.mem_pool()
    comm = torch_nccl_core.communicator(fresh_group)
    numel = 1 << 16
    count_before = comm._resource_count()
    reduced = _nccl_tensor(kind, numel, pool, fresh_group)
    reduced.copy_(rank_tensor(numel, torch.float32, rank))
    dist.all_reduce(reduced, group=fresh_group)
    after_first = comm._resource_count()
    expected_gather = concat(all_ranks(numel, torch.float32))
    gathered = _nccl_tensor(kind, world_size * numel, pool, fresh_group)
    gathered.copy_(poisoned(expected_gather))
    source = _nccl_tensor(kind, numel, pool, fresh_group)
    source.copy_(rank_tensor(numel, torch.float32, rank))
    dist.all_gather_into_tensor(gathered, source, group=fresh_group)
    scattered = _nccl_tensor(kind, numel, pool, fresh_group)
    dist.reduce_scatter_tensor(scattered, gathered, group=fresh_group)
    shuffled = _nccl_tensor(kind, numel, pool, fresh_group)
    dist.all_to_all_single(shuffled, source, group=fresh_group)
    for _ in range(3):  # repeated use of registered memory adds no registration
        dist.all_reduce(reduced, group=fresh_group)
    count_after = comm._resource_count()
    # three more all-reduces each sum world_size copies
    expected_reduced = reference_reduce(all_ranks(numel, torch.float32), "sum") * world_size**3
    per_rank = expected_gather.view(world_size, numel)
    assert count_before == 0
    assert after_first == 1  # the allocation holding `reduced`
    if kind == "empty":
        assert count_after == 5  # one allocation per tensor
    else:
        assert 1 <= count_after <= 2  # tensors carved from a pool share a segment's registration
    assert_equal(reduced, expected_reduced)
    assert_equal(gathered, expected_gather)
    assert_equal(scattered, per_rank[rank] * world_size)
    halves = [t.view(world_size, -1)[rank] for t in all_ranks(numel, torch.float32)]
    assert_equal(shuffled, torch.cat(halves))
    del reduced, gathered, source, scattered, shuffled, pool
    gc.collect()


def test_freeing_nccl_memory_drops_its_registration(rank, fresh_group):
    """Frees are stream-ordered: memory whose stream is idle goes at once, with its registration;
    memory still in use goes once the stream is done (at the next NCCL-memory allocation)."""
    comm = torch_nccl_core.communicator(fresh_group)
    results = []
    counts = []
    for i in range(20):  # freed addresses come back: each must be registered afresh
        t = torch_nccl_core.empty(SWEEP_NUMEL)
        t.copy_(rank_tensor(SWEEP_NUMEL, torch.float32, rank))
        dist.all_reduce(t, group=fresh_group)
        counts.append(comm._resource_count())
        results.append(t.clone())
        in_use = i % 2 == 0
        if not in_use:
            torch.cuda.synchronize()
        del t
        gc.collect()
        if in_use:
            torch.cuda.synchronize()
            torch_nccl_core.empty(1)  # an allocation releases what its streams finished with
        counts.append(comm._resource_count())
    expected = reference_reduce(all_ranks(SWEEP_NUMEL, torch.float32), "sum")
    assert counts == [1, 0] * 20
    for result in results:
        assert_equal(result, expected)


def test_ordinary_memory_is_not_registered(rank, fresh_group):
    comm = torch_nccl_core.communicator(fresh_group)
    t = rank_tensor(SWEEP_NUMEL, torch.float32, rank)
    dist.all_reduce(t, group=fresh_group)
    assert comm._resource_count() == 0
    assert_equal(t, reference_reduce(all_ranks(SWEEP_NUMEL, torch.float32), "sum"))


def test_auto_register_can_be_turned_off(rank, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_CORE_AUTO_REGISTER", "0")
    group = dist.new_group(backend="nccl_core")
    monkeypatch.delenv("TORCH_NCCL_CORE_AUTO_REGISTER")
    comm = torch_nccl_core.communicator(group)
    t = torch_nccl_core.empty(SWEEP_NUMEL)
    t.copy_(rank_tensor(SWEEP_NUMEL, torch.float32, rank))
    dist.all_reduce(t, group=group)
    count = comm._resource_count()
    dist.destroy_process_group(group)
    assert "TORCH_NCCL_CORE_AUTO_REGISTER" not in os.environ
    assert count == 0
    assert_equal(t, reference_reduce(all_ranks(SWEEP_NUMEL, torch.float32), "sum"))


def test_allocate_tensor_serves_from_a_cached_pool(rank):
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    assert backend.supports_tensor_alloc(torch.device("cuda"))
    first = backend.allocate_tensor(1 << 20, dtype=torch.bfloat16, device=torch.device("cuda"))
    address = first.data_ptr()
    del first
    again = backend.allocate_tensor(1 << 20, dtype=torch.bfloat16, device=torch.device("cuda"))
    resolved = torch_nccl_core.resolve_tensor(again)
    assert again.dtype == torch.bfloat16 and again.numel() == 1 << 20
    assert again.data_ptr() == address  # the pool cached the block: no new ncclMemAlloc
    assert resolved[0] == address
    with pytest.raises(ValueError, match="size must be >= 0"):
        backend.allocate_tensor(-1, dtype=torch.float32, device=torch.device("cuda"))


def test_broadcast_leaves_memory_unregistered(rank, fresh_group):
    """Registered broadcast measured slower than the copy-through one: it does not register."""
    comm = torch_nccl_core.communicator(fresh_group)
    t = torch_nccl_core.empty(SWEEP_NUMEL)
    t.copy_(rank_tensor(SWEEP_NUMEL, torch.float32, rank))
    world = dist.get_world_size()
    dist.broadcast(t, src=world - 1, group=fresh_group)
    after_broadcast = comm._resource_count()
    dist.all_reduce(t, group=fresh_group)
    after_all_reduce = comm._resource_count()
    assert (after_broadcast, after_all_reduce) == (0, 1)
    assert_equal(t, rank_tensor(SWEEP_NUMEL, torch.float32, world - 1) * world)


# --- Ordinary PyTorch memory (Options.register_caching_allocator, register_mem_pool) ----------

BIG = 1 << 24  # float32: 64 MiB, a caching-allocator segment of its own after empty_cache


def _registrations_back_to(count: int, group, within_s: float = 10.0) -> dict:
    """The group's registration stats once `count` registrations remain, or at the deadline. An
    op's Work holds its tensors until the watchdog retires it (after the op finished), so the
    last op's segment is freed, and its registration dropped, a little after the op returns."""
    deadline = time.monotonic() + within_s
    while True:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        stats = torch_nccl_core.registration_stats(group)
        if stats["registrations"] == count or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_ordinary_memory_registers_on_first_use_and_torchs_frees_drop_it(rank, world_size):
    """Across nodes (ranks sharing a GPU) registration changes nothing NCCL does: what is
    checked is what is registered and released, and that results stay right while freed
    segments' addresses come back."""
    group = dist.new_group(
        backend="nccl_core",
        pg_options=torch_nccl_core.Options(register_caching_allocator=True),
    )
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch_nccl_core.registration_stats(group)
    wrong = []
    for round_ in range(9):
        numel = BIG + (round_ % 3) * 4096
        x = rank_tensor(numel, torch.float32, rank, salt=round_)
        dist.all_reduce(x, group=group)
        expected = reference_reduce(
            [rank_tensor(numel, torch.float32, r, salt=round_) for r in range(world_size)], "sum"
        )
        if not torch.equal(x, expected):
            wrong.append(round_)
        del x, expected
        if round_ % 3 == 2:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    end = _registrations_back_to(start["registrations"], group)
    dist.destroy_process_group(group)
    assert wrong == []
    assert end["first_uses"] - start["first_uses"] >= 3, (start, end)
    assert end["registrations"] == start["registrations"], (start, end)


def test_a_registered_memory_pool_serves_ops_and_its_end_drops_it(rank, world_size, fresh_group):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(BIG, device="cuda")  # the pool's one segment
    x.copy_(rank_tensor(BIG, torch.float32, rank))
    before = torch_nccl_core.registration_stats(fresh_group)
    torch_nccl_core.register_mem_pool(pool, fresh_group)
    registered = torch_nccl_core.registration_stats(fresh_group)
    dist.all_reduce(x, group=fresh_group)
    torch.cuda.synchronize()
    correct = torch.equal(x, reference_reduce(all_ranks(BIG, torch.float32), "sum"))
    del x, pool  # the pool ends while registered
    torch.cuda.empty_cache()
    ended = torch_nccl_core.registration_stats(fresh_group)
    assert correct
    assert registered["registrations"] == before["registrations"] + 1, (before, registered)
    assert registered["bytes"] - before["bytes"] == 64 << 20, (before, registered)
    assert ended["registrations"] == before["registrations"], (before, ended)

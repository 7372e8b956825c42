"""Registration of ordinary PyTorch memory at one rank: segments of torch's caching allocator
registered by the ops that use them (``Options(register_caching_allocator=True)``), memory pools
registered whole (``register_mem_pool``), and every registration dropped when torch frees its
segment, measured through ``registration_stats``.

Tensors of 64 MiB and more get a caching-allocator segment of their own after
``torch.cuda.empty_cache()``, so each test knows which segment an op registers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

MiB = 1 << 20
NUMEL = 16 * MiB  # float32: 64 MiB, a segment of its own


@pytest.fixture
def registering_group() -> Iterator[dist.ProcessGroup]:
    """A one-rank default group that registers ordinary memory on first use."""
    dist.init_process_group(
        "nccl_core",
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        pg_options=torch_nccl_core.Options(register_caching_allocator=True),
    )
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


def test_an_ordinary_tensor_registers_its_segment_once_and_empty_cache_drops_it(
    registering_group,
):
    torch.cuda.empty_cache()
    before = torch_nccl_core.registration_stats()
    x = torch.full((NUMEL,), 3.0, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    during = torch_nccl_core.registration_stats()
    correct = bool((x == 3.0).all())
    del x
    torch.cuda.empty_cache()
    after = torch_nccl_core.registration_stats()
    assert correct
    assert during["registrations"] == before["registrations"] + 1, (before, during)
    assert during["bytes"] - before["bytes"] == 64 * MiB, (before, during)
    assert during["first_uses"] == before["first_uses"] + 1, (before, during)
    assert during["first_use_seconds"] > before["first_use_seconds"]
    assert (after["registrations"], after["bytes"]) == (
        before["registrations"],
        before["bytes"],
    ), (before, after)


def test_freed_and_reused_memory_never_meets_a_stale_registration(registering_group):
    """Each round frees the last round's segment and takes a new one, often at the same
    address; a stale registration there would be a registration NCCL no longer has."""
    torch.cuda.empty_cache()
    start = torch_nccl_core.registration_stats()
    wrong = []
    for round_ in range(24):
        numel = NUMEL + (round_ % 3) * MiB  # sizes that move the next segment around
        x = torch.full((numel,), float(round_), device="cuda")
        dist.all_reduce(x)
        dist.all_gather_into_tensor(y := torch.empty_like(x), x)
        torch.cuda.synchronize()
        if not (bool((x == round_).all()) and bool((y == round_).all())):
            wrong.append(round_)
        del x, y
        if round_ % 4 == 3:
            torch.cuda.empty_cache()
    torch.cuda.empty_cache()
    end = torch_nccl_core.registration_stats()
    assert wrong == []
    assert end["first_uses"] - start["first_uses"] >= 6  # the segments after each empty_cache
    assert (end["registrations"], end["bytes"]) == (start["registrations"], start["bytes"])


def test_a_memory_pool_registers_whole_and_its_end_drops_it(registering_group):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((NUMEL,), 2.0, device="cuda")
    before = torch_nccl_core.registration_stats()
    torch_nccl_core.register_mem_pool(pool)
    registered = torch_nccl_core.registration_stats()
    twice = _raised(lambda pool=pool: torch_nccl_core.register_mem_pool(pool))
    dist.all_reduce(x)  # registered already: no first use
    torch.cuda.synchronize()
    used = torch_nccl_core.registration_stats()
    torch_nccl_core.deregister_mem_pool(pool)
    dropped = torch_nccl_core.registration_stats()
    never = _raised(lambda pool=pool: torch_nccl_core.deregister_mem_pool(pool))
    not_a_pool = _raised(lambda: torch_nccl_core.register_mem_pool(object()))
    # Registered again, then freed while registered: the pool's end drops it.
    torch_nccl_core.register_mem_pool(pool)
    correct = bool((x == 2.0).all())
    del x, pool
    torch.cuda.empty_cache()
    ended = torch_nccl_core.registration_stats()
    y = torch.ones(8, device="cuda")
    dist.all_reduce(y)  # the group goes on
    assert correct and bool((y == 1.0).all())
    assert registered["registrations"] == before["registrations"] + 1
    assert registered["bytes"] - before["bytes"] == 64 * MiB
    assert isinstance(twice, ValueError) and "registered with group" in str(twice)
    assert used["first_uses"] == registered["first_uses"]
    assert dropped["registrations"] == before["registrations"]
    assert isinstance(never, ValueError) and "is not registered" in str(never)
    assert isinstance(not_a_pool, TypeError) and "MemPool" in str(not_a_pool)
    assert ended["registrations"] == before["registrations"], (before, ended)


def test_expandable_segments_run_right_and_release_what_they_registered():
    """torch maps an expandable segment piece by piece: each mapped range is registered on its
    own (NCCL before 2.29 may refuse a range of several physical allocations: such memory then
    runs unregistered), and unmapping drops it. Its own process: the allocator's setting is
    read once, when CUDA starts."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    child = subprocess.run(
        [sys.executable, "-c", EXPANDABLE_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert "ok" in child.stdout.splitlines(), child.stdout + child.stderr


EXPANDABLE_CHILD = """
import torch, torch.distributed as dist, torch_nccl_core
dist.init_process_group("nccl_core", store=dist.HashStore(), rank=0, world_size=1,
                        pg_options=torch_nccl_core.Options(register_caching_allocator=True))
start = torch_nccl_core.registration_stats()
results = []
for round_ in range(6):
    x = torch.full((1 << 24,) , float(round_), device="cuda")
    dist.all_reduce(x)
    dist.all_gather_into_tensor(y := torch.empty_like(x), x)
    torch.cuda.synchronize()
    results.append(bool((x == round_).all()) and bool((y == round_).all()))
    del x, y
    torch.cuda.empty_cache()
end = torch_nccl_core.registration_stats()
assert all(results), results
# Each round's mapped range was offered to NCCL (which may refuse several physical allocations
# in one range before 2.29), and nothing registered outlived its unmap.
assert end["first_uses"] - start["first_uses"] >= 6, (start, end)
assert end["registrations"] == start["registrations"], (start, end)
dist.destroy_process_group()
print("ok")
"""


def _raised(call) -> BaseException | None:
    """What `call` raised, without its traceback: that would keep the call's frame, and the
    pool in it, alive."""
    try:
        call()
    except Exception as error:  # the test asserts on its type
        return error.with_traceback(None)
    return None

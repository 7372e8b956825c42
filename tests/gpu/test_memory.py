"""NCCL-allocated tensors: torch_nccl_core.empty, resolve_tensor and mem_pool."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import all_ranks, assert_equal, concat, poisoned, rank_tensor, reference_reduce

NCCL_FLOAT32 = 7  # ncclFloat32
NCCL_UINT8 = 1  # ncclUint8


@pytest.mark.parametrize(("morder", "strides"), [("C", (12, 4, 1)), ("F", (1, 2, 6))])
def test_empty_shape_strides_and_data(device, morder, strides):
    t = torch_nccl_core.empty(2, 3, 4, dtype=torch.float16, device=device, morder=morder)
    assert t.shape == (2, 3, 4) and t.stride() == strides
    assert t.dtype == torch.float16 and t.device == device
    t.copy_(torch.arange(24, device=device, dtype=torch.float16).reshape(2, 3, 4))
    assert_equal(t, torch.arange(24, device=device, dtype=torch.float16).reshape(2, 3, 4))


def test_empty_defaults_and_edge_sizes(device):
    assert torch_nccl_core.empty([5]).dtype == torch.get_default_dtype()
    assert torch_nccl_core.empty(5).device == device  # the current device
    assert torch_nccl_core.empty(0, 3, device=device).numel() == 0
    scalar = torch_nccl_core.empty((), device=device)
    assert scalar.shape == () and scalar.fill_(2).item() == 2


def test_resolve_tensor(device):
    t = torch_nccl_core.empty(6, dtype=torch.float32, device=device)
    assert torch_nccl_core.resolve_tensor(t) == (t.data_ptr(), 6, NCCL_FLOAT32, device.index)
    c = torch.zeros(3, dtype=torch.complex64, device=device)
    assert torch_nccl_core.resolve_tensor(c) == (c.data_ptr(), 6, NCCL_FLOAT32, device.index)
    b = torch.zeros(4, dtype=torch.bool, device=device)
    assert torch_nccl_core.resolve_tensor(b)[1:3] == (4, NCCL_UINT8)
    with pytest.raises(ValueError, match="contiguous"):
        torch_nccl_core.resolve_tensor(torch.zeros(4, 4, device=device).t())


def test_collectives_on_nccl_memory(rank, world_size, device):
    numel = 4097
    t = torch_nccl_core.empty(numel, dtype=torch.float32, device=device)
    t.copy_(rank_tensor(numel, torch.float32, rank))
    dist.all_reduce(t)
    gathered = torch_nccl_core.empty(world_size * numel, dtype=torch.float32, device=device)
    gathered.copy_(poisoned(gathered))
    dist.all_gather_into_tensor(gathered, rank_tensor(numel, torch.float32, rank))
    expected = all_ranks(numel, torch.float32)
    assert_equal(t, reference_reduce(expected, "sum"))
    assert_equal(gathered, concat(expected))


def test_mem_pool_serves_collectives(rank, device):
    pool = torch_nccl_core.mem_pool(device)
    numel = 1 << 20
    with torch.cuda.use_mem_pool(pool, device=device):
        t = rank_tensor(numel, torch.float32, rank)
    dist.all_reduce(t)
    segments = pool.snapshot()
    assert_equal(t, reference_reduce(all_ranks(numel, torch.float32), "sum"))
    # The tensor lies in a segment of the pool (allocated through ncclMemAlloc).
    assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segments)
    del t, pool
    gc.collect()


def test_freed_nccl_tensors_return_their_memory(device):
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info(device)
    for _ in range(50):
        t = torch_nccl_core.empty(8 << 20, dtype=torch.uint8, device=device)
        t.fill_(1)
        del t
    gc.collect()
    free_after, _ = torch.cuda.mem_get_info(device)
    # 50 x 8 MiB went through ncclMemAlloc / ncclMemFree; a leak would keep 400 MiB.
    assert free_before - free_after < (64 << 20)

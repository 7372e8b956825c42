"""A collective over more than 2 GiB: byte counts and element counts beyond 32 bits."""

from __future__ import annotations

import torch
import torch.distributed as dist

from benchmarks.expected import rank_fill, summed_fills

from .helpers import WORLD_SIZE

NUMEL = 2**31 + 2**20  # uint8 elements: past INT32_MAX in bytes and in count


def test_all_reduce_over_2_gib(rank):
    tensor = torch.full((NUMEL,), rank_fill(rank), dtype=torch.uint8, device="cuda")
    dist.all_reduce(tensor)
    expected = summed_fills(WORLD_SIZE)
    correct = bool(tensor.eq(expected).all())
    ends = tensor[[0, NUMEL // 2, -1]].tolist()
    del tensor
    torch.cuda.empty_cache()
    assert correct, f"expected {expected} everywhere; first, middle, last elements: {ends}"

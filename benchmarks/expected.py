"""Expected results of collectives on rank-dependent fills, shared by the benchmarks' correctness
checks (benchmarks/cases.py) and the GPU tests (tests/gpu), so that both compute them one way.

Rank r fills its buffer with ``rank_fill(r, base)``, that is base + r; summed over a world of n
ranks that gives ``summed_fills(n, base)`` (for base 1: the triangle number n * (n + 1) / 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def rank_fill(rank: int | torch.Tensor, base: float = 1) -> float | torch.Tensor:
    """The value rank `rank` fills its buffer with (elementwise for a tensor of ranks)."""
    return base + rank


def summed_fills(world: int, base: float = 1) -> float:
    """What a sum of every rank's rank_fill(rank, base) over `world` ranks gives."""
    return sum(rank_fill(r, base) for r in range(world))

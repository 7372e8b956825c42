"""Small models trained the same way on every rank, and the replica they must match: one
unsharded model that trains on every data-parallel rank's batch at once (its gradient is the
average of the ranks' gradients, which is what data parallelism computes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .helpers import WORLD_SIZE

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch without FSDP2
    fully_shard = None

IN, HIDDEN, OUT = 16, 64, 4
BATCH = 8  # per rank
LR = 0.05
DDP_STEPS = 10
FSDP_STEPS = 3


def model() -> nn.Sequential:
    """The same initial weights on every rank and for every copy."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layers = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    return layers.cuda()


def batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000 + rank)
    return [
        (
            torch.randn(BATCH, IN, generator=generator).cuda(),
            torch.randn(BATCH, OUT, generator=generator).cuda(),
        )
        for _ in range(steps)
    ]


def train(module: nn.Module, data) -> torch.Tensor:
    """Plain SGD over `data` (from batches()); returns the loss of every step."""
    optimizer = torch.optim.SGD(module.parameters(), lr=LR)
    losses = []
    for inputs, targets in data:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(module(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def train_replica(
    rank: int, steps: int, replicas: int = WORLD_SIZE
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Train one model on the batches of `replicas` data-parallel ranks; return `rank`'s share
    of each step's loss (the loss a data-parallel rank reports) and the final parameters."""
    replica = model()
    optimizer = torch.optim.SGD(replica.parameters(), lr=LR)
    per_rank = [batches(r, steps) for r in range(replicas)]
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    local_losses = []
    for step in range(steps):
        inputs = torch.cat([per_rank[r][step][0] for r in range(replicas)])
        targets = torch.cat([per_rank[r][step][1] for r in range(replicas)])
        optimizer.zero_grad(set_to_none=True)
        outputs = replica(inputs)
        F.mse_loss(outputs, targets).backward()
        optimizer.step()
        local_losses.append(F.mse_loss(outputs[mine], targets[mine]).detach())
    return torch.stack(local_losses), [p.detach() for p in replica.parameters()]

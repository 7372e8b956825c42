"""Training through DDP and FSDP2 on nccl_core matches built-in NCCL and a local replica.

The replica is one unsharded model on each rank that trains on every rank's batch at once: its
gradient is the average of the ranks' gradients, which is what data parallelism computes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torch_nccl_core

from .helpers import WORLD_SIZE, needs_ranks

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch without FSDP2
    fully_shard = None

IN, HIDDEN, OUT = 16, 64, 4
BATCH = 8  # per rank
LR = 0.05
DDP_STEPS = 10
FSDP_STEPS = 3


def _model() -> nn.Sequential:
    """The same initial weights on every rank and for every copy."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    return model.cuda()


def _batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000 + rank)
    return [
        (
            torch.randn(BATCH, IN, generator=generator).cuda(),
            torch.randn(BATCH, OUT, generator=generator).cuda(),
        )
        for _ in range(steps)
    ]


def _train(model: nn.Module, batches) -> torch.Tensor:
    """Plain SGD over `batches`; returns the loss of every step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _train_replica(rank: int, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Train one model on all ranks' batches; return this rank's share of each step's loss
    (the loss a data-parallel rank reports) and the final parameters."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank = [_batches(r, steps) for r in range(WORLD_SIZE)]
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    local_losses = []
    for step in range(steps):
        inputs = torch.cat([per_rank[r][step][0] for r in range(WORLD_SIZE)])
        targets = torch.cat([per_rank[r][step][1] for r in range(WORLD_SIZE)])
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs)
        F.mse_loss(outputs, targets).backward()
        optimizer.step()
        local_losses.append(F.mse_loss(outputs[mine], targets[mine]).detach())
    return torch.stack(local_losses), [p.detach() for p in model.parameters()]


def _train_ddp(rank: int, device: torch.device, group) -> tuple[torch.Tensor, list[torch.Tensor]]:
    ddp = DistributedDataParallel(_model(), device_ids=[device.index], process_group=group)
    losses = _train(ddp, _batches(rank, DDP_STEPS))
    return losses, [p.detach() for p in ddp.module.parameters()]


def test_ddp_matches_builtin_nccl_and_replica(rank, device, nccl_group):
    core_losses, core_params = _train_ddp(rank, device, None)  # the default group: nccl_core
    nccl_losses, nccl_params = _train_ddp(rank, device, nccl_group)
    replica_losses, replica_params = _train_replica(rank, DDP_STEPS)
    # the same float32 additions in the same order: as good as identical
    torch.testing.assert_close(core_losses, nccl_losses, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(core_params, nccl_params, rtol=1e-6, atol=1e-7)
    # a different batch split changes the rounding
    torch.testing.assert_close(core_losses, replica_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(core_params, replica_params, rtol=1e-5, atol=1e-5)


@needs_ranks(2)  # FSDP2 on one rank communicates nothing
@pytest.mark.skipif(fully_shard is None, reason="this torch has no FSDP2 (fully_shard)")
@pytest.mark.parametrize("comm_buffers", ["torch", "process_group"])
def test_fsdp2_matches_replica(rank, comm_buffers):
    """FSDP2, with its communication buffers from torch or from the group (NCCL memory)."""
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if comm_buffers == "process_group":
        for module in model.modules():  # a per-module setting
            if hasattr(module, "set_allocate_memory_from_process_group_for_comm"):
                module.set_allocate_memory_from_process_group_for_comm(True)
    mesh_comm = torch_nccl_core.communicator(next(model.parameters()).device_mesh.get_group())
    registered_before = mesh_comm._resource_count()
    losses = _train(model, _batches(rank, FSDP_STEPS))
    params = [p.full_tensor() for p in model.parameters()]  # all-gathers the shards
    replica_losses, replica_params = _train_replica(rank, FSDP_STEPS)
    assert all(
        dist.get_backend(p.device_mesh.get_group()) == "nccl_core" for p in model.parameters()
    )
    # Buffers from the group are NCCL memory, registered when FSDP's collectives use them.
    registered = mesh_comm._resource_count() - registered_before
    assert (registered > 0) == (comm_buffers == "process_group"), registered
    torch.testing.assert_close(losses, replica_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(params, replica_params, rtol=1e-5, atol=1e-5)

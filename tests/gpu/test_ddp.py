"""Training through DDP and FSDP2 on nccl_core matches built-in NCCL and a local replica
(training.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torch_nccl_core

from .helpers import load_store_reachable, needs_ranks
from .training import (
    DDP_STEPS,
    FSDP_STEPS,
    LR,
    batches,
    fully_shard,
    model,
    train,
    train_replica,
)


def _train_ddp(rank: int, device: torch.device, group) -> tuple[torch.Tensor, list[torch.Tensor]]:
    ddp = DistributedDataParallel(model(), device_ids=[device.index], process_group=group)
    losses = train(ddp, batches(rank, DDP_STEPS))
    return losses, [p.detach() for p in ddp.module.parameters()]


def test_ddp_matches_builtin_nccl_and_replica(rank, device, nccl_group):
    core_losses, core_params = _train_ddp(rank, device, None)  # the default group: nccl_core
    nccl_losses, nccl_params = _train_ddp(rank, device, nccl_group)
    replica_losses, replica_params = train_replica(rank, DDP_STEPS)
    # the same float32 additions in the same order: as good as identical
    torch.testing.assert_close(core_losses, nccl_losses, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(core_params, nccl_params, rtol=1e-6, atol=1e-7)
    # a different batch split changes the rounding
    torch.testing.assert_close(core_losses, replica_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(core_params, replica_params, rtol=1e-5, atol=1e-5)


def test_ddp_registering_ordinary_memory_with_empty_cache_each_step_matches(
    rank, device, nccl_group
):
    """Gradient buckets of ordinary memory registered on first use, and dropped by torch's
    free of their segments, which empty_cache makes every step (NCCL runs the buckets'
    all_reduces: the package's kernels, which would take these small ones, are off)."""
    group = dist.new_group(
        backend="nccl_core",
        pg_options=torch_nccl_core.Options(
            register_caching_allocator=True, all_reduce_kernels="off"
        ),
    )
    ddp = DistributedDataParallel(model(), device_ids=[device.index], process_group=group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    losses = []
    for inputs, targets in batches(rank, DDP_STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    stats = torch_nccl_core.registration_stats(group)
    core_params = [p.detach() for p in ddp.module.parameters()]
    nccl_losses, nccl_params = _train_ddp(rank, device, nccl_group)
    dist.destroy_process_group(group)
    assert stats["first_uses"] > 0, stats  # the buckets were registered
    torch.testing.assert_close(torch.stack(losses), nccl_losses, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(core_params, nccl_params, rtol=1e-6, atol=1e-7)


@needs_ranks(2)  # FSDP2 on one rank communicates nothing
@pytest.mark.skipif(fully_shard is None, reason="this torch has no FSDP2 (fully_shard)")
@pytest.mark.parametrize("comm_buffers", ["torch", "process_group"])
def test_fsdp2_matches_replica(rank, comm_buffers):
    """FSDP2, with its communication buffers from torch or from the group (NCCL memory)."""
    sharded = model()
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    if comm_buffers == "process_group":
        for module in sharded.modules():  # a per-module setting
            if hasattr(module, "set_allocate_memory_from_process_group_for_comm"):
                module.set_allocate_memory_from_process_group_for_comm(True)
    group = next(sharded.parameters()).device_mesh.get_group()
    mesh_comm = torch_nccl_core.communicator(group)
    registered_before = mesh_comm._resource_count()
    losses = train(sharded, batches(rank, FSDP_STEPS))
    params = [p.full_tensor() for p in sharded.parameters()]  # all-gathers the shards
    replica_losses, replica_params = train_replica(rank, FSDP_STEPS)
    assert all(
        dist.get_backend(p.device_mesh.get_group()) == "nccl_core" for p in sharded.parameters()
    )
    # Buffers from the group are NCCL memory, which NCCL registers when its collectives use
    # them. Among load/store peers, at group sizes the measured table covers, the package's
    # kernels take this model's small all_gathers (through their staging): nothing is
    # registered then.
    registered = mesh_comm._resource_count() - registered_before
    world = dist.get_world_size(group)
    table = torch_nccl_core._C._load_store_kernel("all_gather", world, 8, False)
    nccl_runs = not load_store_reachable(group) or table is None
    assert (registered > 0) == (comm_buffers == "process_group" and nccl_runs), registered
    torch.testing.assert_close(losses, replica_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(params, replica_params, rtol=1e-5, atol=1e-5)

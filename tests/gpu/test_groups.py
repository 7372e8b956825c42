"""Groups beyond the default one: new_group, split_group, DeviceMesh, DTensor, functional ops."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from .helpers import (
    SWEEP_NUMEL,
    WORLD_SIZE,
    all_ranks,
    assert_equal,
    concat,
    needs_ranks,
    poisoned,
    probe_group,
    rank_tensor,
    reference_reduce,
)


def test_new_group_over_every_rank():
    group = dist.new_group(list(range(WORLD_SIZE)))  # the default backend
    backend = dist.get_backend(group)
    probe = probe_group(group)
    dist.destroy_process_group(group)
    assert backend == "nccl_core"
    assert_equal(*probe)


def test_single_rank_groups(rank):
    # new_group is collective over the default group: every rank creates every group
    groups = [dist.new_group([r], backend="nccl_core") for r in range(WORLD_SIZE)]
    mine = groups[rank]
    original = rank_tensor(SWEEP_NUMEL, torch.float32, rank)
    reduced = original.clone()
    gathered = poisoned(original)
    dist.all_reduce(reduced, group=mine)
    dist.all_gather_into_tensor(gathered, original, group=mine)
    size = dist.get_world_size(mine)
    others = [g for r, g in enumerate(groups) if r != rank]
    for group in groups:
        dist.destroy_process_group(group)  # a no-op for groups this rank is not in
    assert size == 1
    assert all(g == dist.GroupMember.NON_GROUP_MEMBER for g in others)
    assert_equal(reduced, original)
    assert_equal(gathered, original)


@pytest.mark.skipif(not hasattr(dist, "split_group"), reason="this torch has no split_group")
@pytest.mark.parametrize(
    "split_ranks",
    [[[r] for r in range(WORLD_SIZE)], [list(range(WORLD_SIZE))]],
    ids=["singletons", "everyone"],
)
def test_split_group(rank, split_ranks):
    group = dist.split_group(split_ranks=split_ranks)
    members = next(ranks for ranks in split_ranks if rank in ranks)
    size = dist.get_world_size(group)
    backend = dist.get_backend(group)
    probe = probe_group(group)
    dist.destroy_process_group(group)
    assert size == len(members)
    assert backend == "nccl_core"
    assert_equal(*probe)


@pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="this torch has no shrink_group")
@needs_ranks(2)
@pytest.mark.parametrize("flags", ["SHRINK_DEFAULT", "SHRINK_ABORT"])
def test_shrink_group_leaves_the_excluded_rank_out(rank, flags):
    group = dist.new_group(list(range(WORLD_SIZE)), backend="nccl_core")
    before = probe_group(group)  # the communicator exists on every rank
    supports = group._get_backend(torch.device("cuda")).supports_shrinking
    excluded = WORLD_SIZE - 1
    # SHRINK_ABORT ends the ops in flight: the probe finishes first (over sockets it may not
    # have yet).
    torch.cuda.synchronize()
    if rank != excluded:  # the excluded rank never calls shrink_group (NCCL's contract)
        shrunk = dist.shrink_group(
            [excluded], group=group, shrink_flags=getattr(dist.distributed_c10d, flags)
        )
        size, backend = dist.get_world_size(shrunk), dist.get_backend(shrunk)
        after = probe_group(shrunk)
        dist.destroy_process_group(shrunk)
    else:
        dist.destroy_process_group(group)
        size, backend, after = WORLD_SIZE - 1, "nccl_core", before
    dist.barrier()
    assert supports
    assert_equal(*before)
    assert (size, backend) == (WORLD_SIZE - 1, "nccl_core")
    assert_equal(*after)


def test_device_mesh_and_dtensor(rank):
    mesh = init_device_mesh("cuda", (WORLD_SIZE,), mesh_dim_names=("dp",))
    full = rank_tensor((8, 6), torch.float32, 0)  # one global tensor, the same on every rank
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    local_shard = sharded.to_local().clone()
    replicated = sharded.redistribute(mesh, [Replicate()]).to_local()
    partial = DTensor.from_local(rank_tensor((8, 6), torch.float32, rank), mesh, [Partial()])
    summed = partial.redistribute(mesh, [Replicate()]).to_local()
    assert dist.get_backend(mesh.get_group()) == "nccl_core"
    assert_equal(local_shard, full.chunk(WORLD_SIZE)[rank])
    assert_equal(replicated, full)
    assert_equal(summed, reference_reduce(all_ranks((8, 6), torch.float32), "sum"))


def _waited(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.wait() if isinstance(tensor, funcol.AsyncCollectiveTensor) else tensor


def test_functional_collectives(rank):
    group = dist.group.WORLD
    numel = SWEEP_NUMEL * WORLD_SIZE
    everyone = all_ranks(numel, torch.float32)
    mine = everyone[rank]
    results = {
        "all_reduce": funcol.all_reduce(mine, "sum", group),
        "all_gather_tensor": funcol.all_gather_tensor(mine, 0, group),
        "reduce_scatter_tensor": funcol.reduce_scatter_tensor(mine, "sum", 0, group),
        "all_to_all_single": funcol.all_to_all_single(mine, None, None, group),
        "broadcast": funcol.broadcast(mine, WORLD_SIZE - 1, group),
    }
    total = reference_reduce(everyone, "sum")
    expected = {
        "all_reduce": total,
        "all_gather_tensor": concat(everyone),
        "reduce_scatter_tensor": total.chunk(WORLD_SIZE)[rank],
        "all_to_all_single": concat([t.chunk(WORLD_SIZE)[rank] for t in everyone]),
        "broadcast": everyone[-1],
    }
    for name, result in results.items():
        assert_equal(_waited(result), expected[name])
    assert_equal(mine, rank_tensor(numel, torch.float32, rank))  # functional ops leave inputs alone

"""What only shows with more than two ranks: groups that are not the whole world, splits into
several colours, and FSDP2 with tensor parallelism on a 2-D DeviceMesh. (All-to-all with uneven
splits, the copy-engine reduce-scatter and the one-sided rings run at any world size in their
own files.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from .helpers import (
    SWEEP_NUMEL,
    WORLD_SIZE,
    assert_equal,
    concat,
    needs_ranks,
    poisoned,
    rank_tensor,
    reference_reduce,
)
from .training import FSDP_STEPS, batches, fully_shard, model, train, train_replica

COLOURS = [[r for r in range(WORLD_SIZE) if r % 2 == colour] for colour in (0, 1)]


def _exchange(rank: int, members: list[int], group: dist.ProcessGroup) -> list[tuple]:
    """all_reduce, all_gather and an uneven all_to_all_single within `group`; returns
    (actual, expected) pairs to compare once every rank has run them."""
    me, size = members.index(rank), len(members)
    everyone = [rank_tensor(SWEEP_NUMEL, torch.float32, r) for r in members]
    reduced = everyone[me].clone()
    dist.all_reduce(reduced, group=group)
    gathered = poisoned(concat(everyone))
    dist.all_gather_into_tensor(gathered, everyone[me], group=group)
    # member s sends s + d + 1 rows to member d
    splits = [[s + d + 1 for d in range(size)] for s in range(size)]
    sent = [rank_tensor(sum(splits[s]), torch.float32, r, salt=1) for s, r in enumerate(members)]
    expected = concat([sent[s].split(splits[s])[me] for s in range(size)])
    received = poisoned(expected)
    dist.all_to_all_single(
        received,
        sent[me],
        output_split_sizes=[splits[s][me] for s in range(size)],
        input_split_sizes=splits[me],
        group=group,
    )
    return [
        (reduced, reference_reduce(everyone, "sum")),
        (gathered, concat(everyone)),
        (received, expected),
    ]


@needs_ranks(4)
def test_groups_of_even_and_of_odd_ranks():
    """Two groups over disjoint halves of the world, each rank using its own."""
    rank = dist.get_rank()
    groups = [dist.new_group(members, backend="nccl_core") for members in COLOURS]
    members = COLOURS[rank % 2]
    results = _exchange(rank, members, groups[rank % 2])
    backends = {dist.get_backend(groups[rank % 2])}
    torch.cuda.synchronize()
    for group in groups:
        dist.destroy_process_group(group)  # a no-op for the group this rank is not in
    assert backends == {"nccl_core"}
    for actual, expected in results:
        assert_equal(actual, expected)


@needs_ranks(4)
@pytest.mark.skipif(not hasattr(dist, "split_group"), reason="this torch has no split_group")
def test_split_into_two_colours():
    rank = dist.get_rank()
    group = dist.split_group(split_ranks=COLOURS)
    members = COLOURS[rank % 2]
    size = dist.get_world_size(group)
    results = _exchange(rank, members, group)
    torch.cuda.synchronize()
    dist.destroy_process_group(group)
    assert size == len(members)
    for actual, expected in results:
        assert_equal(actual, expected)


def _train_on_a_2d_mesh(mesh) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """FSDP2 over the mesh's "dp" dimension, column- then row-wise tensor parallelism over its
    "tp" dimension; returns the losses of every step and the final full parameters."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    sharded = model()
    parallelize_module(sharded, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(sharded, mesh=mesh["dp"])
    replica = mesh["dp"].get_local_rank()  # the ranks of one "tp" group share their batches
    losses = train(sharded, batches(replica, FSDP_STEPS))
    return losses, [p.full_tensor() for p in sharded.parameters()]  # all-gathers both dims


def _reference_mesh(layout: torch.Tensor, reference_backend: str):
    """The mesh of `layout` ("dp" x "tp") over torch's built-in NCCL backend."""
    from torch.distributed.device_mesh import DeviceMesh

    rank = dist.get_rank()
    # new_group is collective over the default group: every rank creates every group
    dp = [dist.new_group(column.tolist(), backend=reference_backend) for column in layout.T]
    tp = [dist.new_group(row.tolist(), backend=reference_backend) for row in layout]
    row, column = (int(i) for i in (layout == rank).nonzero()[0])
    mine = [dp[column], tp[row]]
    return DeviceMesh.from_group(mine, "cuda", mesh=layout, mesh_dim_names=("dp", "tp"))


@needs_ranks(4)
@pytest.mark.skipif(WORLD_SIZE % 2 != 0, reason="a (world / 2) x 2 mesh needs an even world")
@pytest.mark.skipif(fully_shard is None, reason="this torch has no FSDP2 (fully_shard)")
def test_fsdp2_with_tensor_parallel_on_a_2d_mesh_matches_builtin_and_replica(nccl_group):
    """Step by step the same losses and, at the end, the same parameters as on built-in NCCL
    (the same mesh of groups of torch's ProcessGroupNCCL) and as one unsharded model trained on
    every data-parallel rank's batch."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (WORLD_SIZE // 2, 2), mesh_dim_names=("dp", "tp"))
    core_losses, core_params = _train_on_a_2d_mesh(mesh)
    backends = {dist.get_backend(mesh[dim].get_group()) for dim in ("dp", "tp")}
    reference = _reference_mesh(mesh.mesh, dist.get_backend(nccl_group))
    nccl_losses, nccl_params = _train_on_a_2d_mesh(reference)
    replica = mesh["dp"].get_local_rank()
    replica_losses, replica_params = train_replica(replica, FSDP_STEPS, WORLD_SIZE // 2)
    assert backends == {"nccl_core"}
    # the same float32 additions in the same order: as good as identical
    torch.testing.assert_close(core_losses, nccl_losses, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(core_params, nccl_params, rtol=1e-6, atol=1e-7)
    # a different batch split changes the rounding
    torch.testing.assert_close(core_losses, replica_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(core_params, replica_params, rtol=1e-5, atol=1e-5)

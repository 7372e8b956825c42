"""torch_nccl_core.Options on a real communicator, and the version and feature queries."""

from __future__ import annotations

from datetime import timedelta

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
    probe_group,
    rank_tensor,
    reference_reduce,
    ring_peers,
    window_refusal,
)

OPTION_SETS = {
    "defaults": {},
    "tuned": {
        "timeout": timedelta(seconds=60),
        "high_priority_stream": True,
        "comm_name": "x",
        "min_ctas": 1,
        "max_ctas": 8,
    },
    "blocking-cga": {"blocking": True, "cga_cluster_size": 2},
    "nonblocking": {"blocking": False},
}


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_group_with_options_runs_collectives(rank, name):
    options = torch_nccl_core.Options(**OPTION_SETS[name])
    group = dist.new_group(backend="nccl_core", pg_options=options)
    probe = probe_group(group)
    expected = concat(all_ranks(SWEEP_NUMEL, torch.float32))
    gathered = poisoned(expected)
    work = dist.all_gather_into_tensor(
        gathered, rank_tensor(SWEEP_NUMEL, torch.float32, rank), group=group, async_op=True
    )
    work.wait()
    dist.destroy_process_group(group)
    assert_equal(*probe)
    assert_equal(gathered, expected)


def test_zero_cta_policy_runs_all_gather_and_all_to_all(rank, world_size):
    """NCCL_CTA_POLICY_ZERO: results only; whether copy engines ran is NCCL's choice (within a
    node; across nodes, as ranks sharing a GPU are, from NCCL 2.30.7)."""
    group = dist.new_group(
        backend="nccl_core", pg_options=torch_nccl_core.Options(cta_policy="zero")
    )
    expected = concat(all_ranks(SWEEP_NUMEL, torch.float32))
    gathered = poisoned(expected)
    mine = rank_tensor(SWEEP_NUMEL * world_size, torch.float32, rank)
    dist.all_gather_into_tensor(
        gathered, rank_tensor(SWEEP_NUMEL, torch.float32, rank), group=group
    )
    shuffled = torch.empty_like(mine)
    dist.all_to_all_single(shuffled, mine, group=group)
    torch.cuda.synchronize()
    dist.destroy_process_group(group)
    assert_equal(gathered, expected)
    sent_to_me = [
        rank_tensor(SWEEP_NUMEL * world_size, torch.float32, r).chunk(world_size)[rank]
        for r in range(world_size)
    ]
    assert_equal(shuffled, concat(sent_to_me))


def test_nccl_version_is_a_supported_release():
    version = torch_nccl_core.nccl_version()
    assert isinstance(version, tuple), version
    assert len(version) == 3, version
    assert all(isinstance(part, int) for part in version), version
    assert version >= (2, 28, 0), version


def test_features_are_named_booleans():
    features = torch_nccl_core.features()
    assert isinstance(features, dict), features
    assert all(isinstance(k, str) and isinstance(v, bool) for k, v in features.items()), features
    assert "float8" in features, features


def test_nonblocking_group_runs_every_kind_of_call(rank, world_size):
    """A nonblocking communicator: collectives, p2p, coalescing, a split and a window (or,
    where NCCL gives it none, the refusal)."""
    options = torch_nccl_core.Options(blocking=False)
    group = dist.new_group(backend="nccl_core", pg_options=options)
    after, before = ring_peers(rank)
    received = torch.zeros(SWEEP_NUMEL, device="cuda")
    ops = [
        dist.P2POp(dist.isend, rank_tensor(SWEEP_NUMEL, torch.float32, rank), after, group=group),
        dist.P2POp(dist.irecv, received, before, group=group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    child = dist.split_group(group, split_ranks=[list(range(world_size))])
    child_probe = probe_group(child)
    refusal = window_refusal(group)
    if refusal is None:
        window_tensor = torch_nccl_core.empty(SWEEP_NUMEL, group=group, window=True)
    else:  # NCCL gives the communicator no windows (its query runs on it as well)
        with pytest.raises(NotImplementedError, match="no symmetric memory"):
            torch_nccl_core.empty(SWEEP_NUMEL, group=group, window=True)
        window_tensor = torch.empty(SWEEP_NUMEL, device="cuda")
    window_tensor.copy_(rank_tensor(SWEEP_NUMEL, torch.float32, rank))
    dist.all_reduce(window_tensor, group=group)
    probe = probe_group(group)
    dist.destroy_process_group(child)
    dist.destroy_process_group(group)
    assert_equal(received, rank_tensor(SWEEP_NUMEL, torch.float32, before))
    assert_equal(*child_probe)
    assert_equal(window_tensor, reference_reduce(all_ranks(SWEEP_NUMEL, torch.float32), "sum"))
    assert_equal(*probe)

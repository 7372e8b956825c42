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

"""One-process GPU suite: every test makes its own one-rank `nccl_core` default group, so it runs
under plain pytest on any machine with one GPU or more:

    python -m pytest tests/gpu_single -q

At one rank NCCL moves no data between GPUs, but the whole backend runs: argument checks, the op
path (sync, async, coalesced), CUDA graph capture beside the watchdog, the profiler, the flight
recorder, timing, NCCL memory and windows (the window-free twin), teardown and re-initialisation.
The two-rank behaviour is the business of tests/gpu. Without CUDA every test here is skipped.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent
SKIP_REASON = "needs a CUDA GPU"
TEST_TIMEOUT_S = 60


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason=SKIP_REASON)
    timeout = config.pluginmanager.hasplugin("timeout")
    for item in items:
        if HERE not in pathlib.Path(item.path).resolve().parents:
            continue
        if skip is not None:
            item.add_marker(skip)
        if timeout and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S, method="thread"))


@pytest.fixture
def group() -> Iterator[dist.ProcessGroup]:
    """A one-rank default group on nccl_core, destroyed after the test (no set_device: programs
    often make none)."""
    import torch_nccl_core  # noqa: F401 - registers the "nccl_core" backend

    dist.init_process_group("nccl_core", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()

"""PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test), as
PyTorch runs it for its NCCL backend (test/distributed/test_distributed_spawn.py), with every
process group created on the backend named by NCCL_CORE_CONFORMANCE_BACKEND (default nccl_core).

It stays an NCCL run (BACKEND=nccl), so the suite picks CUDA tensors and NCCL's feature sets;
only the groups move. Tests that assert the backend's name ("nccl") are expected to differ, see
docs/compatibility.md. Run through .ci/conformance, which compares against the built-in backend.
Not collected by `pytest tests` (WORLD_SIZE GPUs, default 2, and that many processes per test).
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("BACKEND", "nccl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())  # each test's setUp makes its own

import torch
import torch.distributed.distributed_c10d as c10d

TARGET = os.environ.get("NCCL_CORE_CONFORMANCE_BACKEND", "nccl_core")


def _retarget(backend):
    """ "nccl" -> TARGET, also inside a device map ("cpu:gloo,cuda:nccl")."""
    if backend is None or TARGET == "nccl":
        return backend
    parts = []
    for part in str(backend).split(","):
        device, sep, name = part.rpartition(":")
        parts.append(f"{device}{sep}{TARGET if name == 'nccl' else name}")
    return ",".join(parts)


if TARGET != "nccl":
    import torch_nccl_core  # noqa: F401  (registers nccl_core)

    _new_process_group_helper = c10d._new_process_group_helper

    def _on_target(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        return _new_process_group_helper(
            group_size, group_rank, global_ranks_in_group, _retarget(backend), *args, **kwargs
        )

    c10d._new_process_group_helper = _on_target

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

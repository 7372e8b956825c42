"""PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test), as
PyTorch runs it for its NCCL backend (test/distributed/test_distributed_spawn.py), with every
process group created on the backend named by NCCL_CORE_CONFORMANCE_BACKEND (default nccl_core).

It stays an NCCL run (BACKEND=nccl), so the suite picks CUDA tensors and NCCL's feature sets;
only the groups move. Tests that assert the backend's name ("nccl") are expected to differ, see
docs/compatibility.md. Run through .ci/conformance, which compares against the built-in backend.
Not collected by `pytest tests` (WORLD_SIZE processes per test).

Where the ranks outnumber the GPUs (a one-GPU world, README), the harness adapts the suite's
device bookkeeping, the same way for both backends: each test process claims a host of its own
(NCCL_HOSTID, before NCCL starts in it), as torch_nccl_core.launch does, so NCCL connects the
ranks as nodes; rank r's GPUs are [r % GPU count]; torch.cuda.set_device takes an index modulo
the GPU count; and the suite's GPU-count checks (its _run and skip_if_lt_x_gpu) see a GPU per
rank. Tests that name a device by rank themselves (cuda:1 on one GPU) fail on both backends: the
comparison lists them apart.

Each test process freezes every object it holds (gc.freeze) before its test, alike for both
backends. Without that, Python's full garbage collection scans the ~313k objects that torch and
the suite import, a ~200 ms pause, and strikes wherever allocation counts happen to fall, which
a few hundred more imported objects move. Tests whose ranks race by milliseconds then pass or
fail by where it strikes rather than by the backend: in test_post_localSGD_optimizer_step_reload
rank 0 deletes a checkpoint a few ms after a barrier, and rank 1 loads it after the same barrier
(docs/compatibility.md). Frozen, a full collection scans only what the test made.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import tempfile

os.environ.setdefault("BACKEND", "nccl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())  # each test's setUp makes its own

import torch
import torch.distributed.distributed_c10d as c10d

TARGET = os.environ.get("NCCL_CORE_CONFORMANCE_BACKEND", "nccl_core")
WORLD_SIZE = int(os.environ["WORLD_SIZE"])
GPUS = torch.cuda.device_count()
SHARED = 0 < GPUS < WORLD_SIZE  # ranks share GPUs, as nodes of their own


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

import torch.testing._internal.distributed.distributed_test as suite  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# The suite checks profiler events only for the backends it lists (dist.get_backend() names the
# target): listed, nccl_core's ranges are held to what the built-in's are.
_LISTINGS = (
    "PROFILING_SUPPORTED_BACKENDS",
    "CUDA_PROFILING_SUPPORTED_BACKENDS",
    "SEND_RECV_PROFILING_SUPPORTED_BACKENDS",
)
for _listing in _LISTINGS:
    if TARGET not in getattr(suite, _listing):
        getattr(suite, _listing).append(TARGET)


@contextlib.contextmanager
def _unlisted():
    """The suite's profiler checks as the built-in's column has them: TARGET unlisted."""
    listed = [name for name in _LISTINGS if TARGET in getattr(suite, name)]
    for name in listed:
        getattr(suite, name).remove(TARGET)
    try:
        yield
    finally:
        for name in listed:
            getattr(suite, name).append(TARGET)


_set_device = torch.cuda.set_device


def _shared_set_device(device) -> None:
    index = torch.cuda._utils._get_device_index(device, optional=True)
    _set_device(index % GPUS if index >= 0 else index)


def _share_gpus(rank: int) -> None:
    """In a spawned test process, before the suite's _run: a host of its own for NCCL (only one
    communicator's ranks compare host ids), its GPU, then the suite's view of a GPU per rank.
    The count is replaced only once CUDA has started on the real device: torch's lazy
    initialization checks every device up to torch.cuda.device_count()."""
    os.environ["NCCL_HOSTID"] = f"conformance-{rank}"
    _set_device(rank % GPUS)
    # Read when each test runs (the skip decorators' wrappers, the suite's _run); torch's C++
    # keeps the real count.
    torch.cuda.device_count = lambda: WORLD_SIZE
    torch.cuda.set_device = _shared_set_device
    suite.init_multigpu_helper = lambda world_size, backend: {
        r: [r % GPUS] for r in range(world_size)
    }


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    if TARGET != "nccl":
        # wraps: the suite's skip marks (on its function) stay with the test.
        @functools.wraps(DistributedTest._DistTestBase.test_nccl_high_priority_stream)
        def test_nccl_high_priority_stream(self):
            # Its broadcast runs on a ProcessGroupNCCL the test makes itself, whose ranges are
            # "nccl:broadcast", while the suite looks for ranges named after the default group's
            # backend: "nccl_core:broadcast", which that op cannot have.
            with _unlisted():
                super().test_nccl_high_priority_stream()

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        if SHARED:
            _share_gpus(rank)
        gc.freeze()
        super()._run(rank, test_name, file_name, pipe, **kwargs)

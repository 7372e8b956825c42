"""GPU suite: one pytest session per rank, launched as

    torchrun --nproc-per-node=N -m pytest tests/gpu -q

with N a power of two, on GPU LOCAL_RANK % GPU count. Where ranks outnumber the GPUs they share
them, as nodes of their own (torch_nccl_core.launch gives each its NCCL_HOSTID):

    python -m torch_nccl_core.launch --mps --nproc-per-node=N -m pytest tests/gpu -q

Every session
collects the same tests in the same order, so each collective a test issues meets its partners
on the other ranks; a test that needs more ranks than the world has is skipped
(helpers.needs_ranks).
Rules for tests in this folder:
  * never let one rank skip, return or raise before a collective that another rank runs
    (a skip decided from the same facts on every rank is fine);
  * run every collective of a test first and assert afterwards, so a failed assertion on one
    rank leaves the ranks in step for the next test.
Without torchrun and a GPU every test here is skipped.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import WORLD_SIZE, local_device, owned_group, window_refusal

GPU_DIR = pathlib.Path(__file__).resolve().parent
SKIP_REASON = "needs torchrun --nproc-per-node=N and a GPU; see README"
SHARED_GPU_REASON = (
    "ranks share a GPU without a host id each: launch with python -m torch_nccl_core.launch"
)
# Per-test limit (pytest-timeout, where installed). The thread method dumps every stack and ends
# the process: a rank hung inside a CUDA or NCCL wait cannot be interrupted by a signal.
TEST_TIMEOUT_S = 120
REFERENCE_BACKEND = "nccl_reference"


def _in_gpu_dir(item: pytest.Item) -> bool:
    return GPU_DIR in pathlib.Path(item.path).resolve().parents


def _why_not_runnable() -> str | None:
    """Why this session cannot run the suite; None if it can."""
    if not ("WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ):
        return SKIP_REASON
    gpus = torch.cuda.device_count()
    if gpus == 0:
        return SKIP_REASON
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > gpus and "NCCL_HOSTID" not in os.environ:
        return SHARED_GPU_REASON  # NCCL would refuse two ranks on one GPU of one host
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"gpu: {SKIP_REASON}")
    config.addinivalue_line("markers", "timeout(seconds): per-test limit (pytest-timeout)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if _in_gpu_dir(item)]
    if not ours:
        return
    reason = _why_not_runnable()
    skip = None if reason is None else pytest.mark.skip(reason=reason)
    if skip is None and WORLD_SIZE & (WORLD_SIZE - 1):
        # NCCL averages by summing inputs premultiplied by 1 / world, which rounds unless the
        # world is a power of two: the expected values would not be exact.
        skip = pytest.mark.skip(reason="needs a world of 1, 2, 4, 8, ... ranks")
    timeout = (
        pytest.mark.timeout(TEST_TIMEOUT_S, method="thread")
        if config.pluginmanager.hasplugin("timeout")
        else None
    )
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)
        if timeout is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(timeout)


def _create_reference_nccl(backend_opts, _pg_options):
    """torch's own ProcessGroupNCCL, registered under another name as the reference backend.

    dist.new_group(backend="nccl") would not do: in torch 2.11 it splits the new communicator
    from the default group's backend whenever that one is bound to a device and supports
    splitting, which only works when the default group is ProcessGroupNCCL itself.
    """
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = backend_opts.timeout
    options.global_ranks_in_group = backend_opts.global_ranks_in_group
    options.group_name = backend_opts.group_id
    return dist.ProcessGroupNCCL(
        backend_opts.store, backend_opts.group_rank, backend_opts.group_size, options
    )


def _new_reference_group() -> dist.ProcessGroup:
    if REFERENCE_BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            REFERENCE_BACKEND, _create_reference_nccl, extended_api=True, devices=["cuda"]
        )
    return dist.new_group(backend=REFERENCE_BACKEND)


class _Deadline:
    """NCCL_CORE_SUITE_DEADLINE_S: past that many seconds, every rank stops after the same test,
    so that a run cut by the time it has still reports what ran. The ranks agree after each test
    over a gloo group (a few hundred microseconds), so that none runs ahead into a collective."""

    def __init__(self) -> None:
        limit = os.environ.get("NCCL_CORE_SUITE_DEADLINE_S")
        self.end = time.monotonic() + float(limit) if limit else None
        self.group: dist.ProcessGroup | None = None
        self.session: pytest.Session | None = None

    def check(self) -> None:
        if self.end is None or self.group is None or not dist.is_initialized():
            return
        past = torch.tensor([int(time.monotonic() > self.end)])
        dist.all_reduce(past, op=dist.ReduceOp.MAX, group=self.group)
        if past.item():
            self.session.shouldstop = "NCCL_CORE_SUITE_DEADLINE_S reached"


_DEADLINE = _Deadline()


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    _DEADLINE.check()


def _exit_unless_same_tests(session: pytest.Session) -> None:
    """Stop every session if the ranks selected different tests: their collectives would hang.

    Compared over a gloo group, so that the check does not depend on the backend under test.
    """
    ids = "\n".join(item.nodeid for item in session.items if _in_gpu_dir(item))
    digests = [None] * WORLD_SIZE
    group = dist.new_group(backend="gloo")
    dist.all_gather_object(digests, hashlib.sha256(ids.encode()).hexdigest(), group=group)
    if _DEADLINE.end is not None:
        _DEADLINE.group, _DEADLINE.session = group, session
    else:
        dist.destroy_process_group(group)
    if len(set(digests)) != 1:
        pytest.exit("the ranks collected different tests; run the same command on every rank", 3)


@pytest.fixture(scope="session", autouse=True)
def _distributed(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    """The default process group, on nccl_core, for the whole session."""
    import torch_nccl_core  # noqa: F401 - registers the "nccl_core" backend

    device = local_device()
    torch.cuda.set_device(device)
    dist.init_process_group("nccl_core", device_id=device)
    assert dist.get_world_size() == WORLD_SIZE
    _exit_unless_same_tests(request.session)
    yield device
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()  # every group, the reference one included


@pytest.fixture(scope="session")
def rank(_distributed) -> int:
    return dist.get_rank()


@pytest.fixture(scope="session")
def world_size(_distributed) -> int:
    return dist.get_world_size()


@pytest.fixture(scope="session")
def device(_distributed) -> torch.device:
    return _distributed


@pytest.fixture(scope="session")
def nccl_group(_distributed) -> dist.ProcessGroup:
    """A group over every rank on torch's built-in NCCL backend (ProcessGroupNCCL).

    Created by the first test that asks for it, at the same point on every rank.
    """
    return _new_reference_group()


@pytest.fixture
def windows(_distributed) -> None:
    """Skips a test of windows where NCCL gives the world's communicator none (ranks that are
    not load/store reachable, NCCL >= 2.29 without GIN), with NCCL's reason; the refusal itself
    is tested by test_communicator.py's test_without_symmetric_memory_windows_are_refused."""
    reason = window_refusal()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def fresh_group(_distributed) -> Iterator[dist.ProcessGroup]:
    """A new nccl_core group over every rank, destroyed after the test.

    Its resource counts start from zero, NCCL runs all its all_reduces, all_gathers and
    reduce_scatters (the package's kernels, which would take the small ones, are off: these tests
    watch what NCCL registers), and its
    timeout is short: a call the backend wrongly accepts (a receive nobody sends to) hangs only
    this group, and the watchdog turns that into an error within seconds instead of stalling the
    rest of the suite.
    """
    options = torch_nccl_core.Options(all_reduce_kernels="off", gather_scatter_kernels=False)
    group = dist.new_group(backend="nccl_core", timeout=timedelta(seconds=10), pg_options=options)
    yield from owned_group(group)

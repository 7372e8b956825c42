"""The backend's routing (csrc/backend/routing/comm_routes.h) against the scripted NCCL.

Which communicator an op runs on (the group's, or the window-free twin made with the first
symmetric window), what it registers automatically and when that is released: logic the GPU
suite can only see through timings and resource counts, run here on CPU tensors whose memory is
recorded as NCCL memory.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from threads import in_thread

import torch_nccl_core
from torch_nccl_core import _C

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


SYMMETRIC = _C.NCCL_WIN_COLL_SYMMETRIC
DEFAULT = 0
MiB = 1 << 20

# Registering a window prepares the load/store one-sided engine where that engine is chosen, and
# that needs a GPU. The choice is made once per process, by the loaded NCCL (the fake's
# communicators follow it).
pytestmark = pytest.mark.skipif(
    torch_nccl_core.one_sided_engine() != "nccl",
    reason="fake windows stay off the load/store engine only with NCCL >= 2.29's host API",
)


@pytest.fixture
def memory():
    """Makes CPU tensors of `nbytes` that count as NCCL memory until the test ends."""
    made: list[torch.Tensor] = []

    def make(nbytes: int) -> torch.Tensor:
        tensor = torch.empty(nbytes // 4, dtype=torch.float32)
        testing.record_allocation(tensor)
        made.append(tensor)
        return tensor

    yield make
    for tensor in made:
        testing.forget_allocation(tensor)


@pytest.fixture
def group(fake):
    """(communicator, routes) of a fake two-rank group."""
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), False, "group 'g'")
    routes = testing.CommRoutes(comm)
    yield comm, routes
    testing.abort(comm)


def test_no_twin_without_a_symmetric_window(fake, group, memory):
    comm, routes = group
    x = memory(4096)
    testing.register_window(comm, x, DEFAULT)
    assert routes.twin is None and fake.calls("ncclCommSplit") == 0
    assert routes.route("all_reduce", [x], [x]) == "group"
    # NCCL finds window memory by itself: nothing registered on top.
    assert fake.calls("ncclCommRegister") == 0


def test_first_symmetric_window_makes_the_twin_once(fake, group, memory):
    comm, routes = group
    testing.register_window(comm, memory(4096), SYMMETRIC)
    testing.register_window(comm, memory(4096), SYMMETRIC)
    assert fake.calls("ncclCommSplit") == 1
    assert routes.twin is not None and routes.twin.size == comm.size


@pytest.mark.parametrize(
    ("op", "nbytes", "expected"),
    [
        ("all_reduce", 4096, "twin"),  # below 2 MiB symmetric kernels gain nothing
        ("all_reduce", 4 * MiB, "group"),  # 2-64 MiB: they win
        ("all_reduce", 64 * MiB, "twin"),  # from 64 MiB the ring wins
        ("reduce_scatter", 4 * MiB, "group"),
        ("all_gather", 4 * MiB, "twin"),  # the registered ring is never slower
        ("broadcast", 4 * MiB, "twin"),
    ],
)
def test_window_memory_routes_by_the_measured_table(group, memory, op, nbytes, expected):
    comm, routes = group
    x = memory(nbytes)
    testing.register_window(comm, x, SYMMETRIC)
    assert routes.route(op, [x], [x]) == expected


def test_the_twin_registers_window_memory_once(fake, group, memory):
    comm, routes = group
    x, out = memory(4096), memory(8192)
    testing.register_window(comm, x, SYMMETRIC)
    testing.register_window(comm, out, SYMMETRIC)
    for _ in range(3):
        assert routes.route("all_gather", [out], [x]) == "twin"
    assert fake.calls("ncclCommRegister") == 2
    assert routes.twin._resource_count() == 2
    assert comm._resource_count() == 2  # the two windows, nothing registered over them
    # Broadcast gains nothing from registration (docs/memory.md): none made.
    y = memory(4096)
    testing.register_window(comm, y, SYMMETRIC)
    assert routes.route("broadcast", [y], [y]) == "twin"
    assert fake.calls("ncclCommRegister") == 2


def test_plain_nccl_memory_is_registered_on_the_group_once(fake, group, memory):
    comm, routes = group
    testing.register_window(comm, memory(4096), SYMMETRIC)  # a twin exists
    x = memory(4096)
    for _ in range(3):
        assert routes.route("all_reduce", [x], [x]) == "group"
    assert fake.calls("ncclCommRegister") == 1
    assert comm._resource_count() == 2 and routes.twin._resource_count() == 0


def test_ordinary_memory_is_left_alone(fake, group):
    comm, routes = group
    x = torch.empty(1024)
    assert routes.route("all_reduce", [x], [x]) == "group"
    assert fake.calls("ncclCommRegister") == 0 and comm._resource_count() == 0


def test_one_symmetric_tensor_moves_the_op(group, memory):
    """As NCCL would take its symmetric kernels when any buffer lies in a symmetric window."""
    comm, routes = group
    window, plain = memory(4096), memory(4096)
    testing.register_window(comm, window, SYMMETRIC)
    assert routes.route("all_gather", [window], [plain]) == "twin"
    assert routes.route("all_gather", [plain], [plain]) == "group"


def test_any_symmetric_window_over_the_memory_counts(group, memory):
    """A tensor under a default window and a symmetric one: NCCL takes its symmetric kernels."""
    comm, routes = group
    x = memory(4096)
    testing.register_window(comm, x, DEFAULT)
    testing.register_window(comm, x, SYMMETRIC)
    assert routes.route("all_reduce", [x], [x]) == "twin"


def test_ops_bound_to_the_group_stay_there(group, memory):
    """A custom reduce op belongs to the group's communicator: not routable."""
    comm, routes = group
    x = memory(4096)
    testing.register_window(comm, x, SYMMETRIC)
    assert routes.route("all_reduce", [x], [x], routable=False) == "group"


@pytest.mark.parametrize("when", ["before_the_twin", "after_the_twin"])
def test_a_new_timeout_reaches_the_twin(fake, group, memory, when):
    """set_timeout bounds the twin's nonblocking calls too, whenever the twin was made."""
    comm, routes = group
    if when == "after_the_twin":
        testing.register_window(comm, memory(4096), SYMMETRIC)
    routes.set_timeout(timedelta(milliseconds=300))
    if when == "before_the_twin":
        testing.register_window(comm, memory(4096), SYMMETRIC)
    fake.hold("ncclCommSplit")
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError, match=r"twin.*did not complete within 300 ms"):
        testing.split(routes.twin, 0, 0)
    assert time.monotonic() - start < 2.0
    fake.release("ncclCommSplit")


def test_a_closed_window_stops_moving_ops(fake, group, memory):
    comm, routes = group
    x = memory(4096)
    window = testing.register_window(comm, x, SYMMETRIC)
    assert routes.route("all_reduce", [x], [x]) == "twin"
    window.close()
    assert routes.route("all_reduce", [x], [x]) == "group"
    assert comm._resource_count() == 1  # registered there now that no window covers it


def test_freeing_memory_releases_its_registrations(fake, group, memory):
    comm, routes = group
    x = memory(4096)
    testing.register_window(comm, memory(4096), SYMMETRIC)
    routes.route("all_reduce", [x], [x])
    assert comm._resource_count() == 2
    testing.forget_allocation(x)
    assert fake.calls("ncclCommDeregister") == 1 and comm._resource_count() == 1
    # The same address recorded again is a new allocation: registered anew.
    testing.record_allocation(x)
    routes.route("all_reduce", [x], [x])
    assert fake.calls("ncclCommRegister") == 2 and comm._resource_count() == 2
    # So are the twin's registrations.
    y = memory(4096)
    testing.register_window(comm, y, SYMMETRIC)
    assert routes.route("all_reduce", [y], [y]) == "twin"
    assert routes.twin._resource_count() == 1
    testing.forget_allocation(y)
    assert routes.twin._resource_count() == 0


def test_coalesced_ops_stay_on_the_group(group, memory):
    """Every op of one NCCL group must run on one communicator."""
    comm, routes = group
    x = memory(4096)
    testing.register_window(comm, x, SYMMETRIC)
    assert routes.route("all_reduce", [x], [x], coalescing=True) == "group"


def test_without_auto_registration_nothing_is_registered(fake, memory):
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), False, "group 'g'")
    routes = testing.CommRoutes(comm, auto_register=False)
    x, y = memory(4096), memory(4096)
    testing.register_window(comm, y, SYMMETRIC)
    assert routes.route("all_reduce", [x], [x]) == "group"
    assert routes.route("all_reduce", [y], [y]) == "twin"
    assert fake.calls("ncclCommRegister") == 0
    testing.abort(comm)


def test_aborting_the_group_aborts_the_twin(fake, group, memory):
    comm, routes = group
    testing.register_window(comm, memory(4096), SYMMETRIC)
    twin = routes.twin
    testing.abort(comm)
    assert twin.is_aborted
    assert fake.live == 0


@pytest.mark.parametrize("blocking", [True, False])
def test_the_twin_stops_first_and_is_freed_after_the_group(fake, memory, blocking):
    """Was: the twin aborted first, whose device-synchronizing frees then waited for the group's
    op that a silent peer kept running, before the group's own abort could end it. Now the
    twin's kernels are stopped first (ncclCommRevoke, on a blocking communicator), the group is
    aborted, then the twin."""
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), blocking, "group 'g'")
    routes = testing.CommRoutes(comm)
    testing.register_window(comm, memory(4096), SYMMETRIC)
    twin = routes.twin
    fake.hold("ncclCommAbort")
    thread, outcome = in_thread(lambda: testing.abort(comm))
    deadline = time.monotonic() + 5
    while fake.inside("ncclCommAbort") == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    # Read while the first ncclCommAbort is held.
    twin_aborted_first, revoked_first = twin.is_aborted, fake.calls("ncclCommRevoke")
    fake.release("ncclCommAbort")
    thread.join(5)
    assert "error" not in outcome, outcome
    assert comm.is_aborted and not twin_aborted_first and twin.is_aborted
    assert revoked_first == (1 if blocking else 0)
    assert fake.calls("ncclCommAbort") == 2


def test_a_flushed_twin_is_not_revoked(fake, memory):
    """A clean shutdown finalizes the group and its twin, then aborts them: the twin's kernels
    are not revoked then (NCCL refuses ncclCommRevoke once ncclCommFinalize started; was, a
    refused revoke logged as an NCCL error at every shutdown)."""
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), True, "group 'g'")
    routes = testing.CommRoutes(comm)
    testing.register_window(comm, memory(4096), SYMMETRIC)
    twin = routes.twin
    assert testing.flush(comm) and testing.flush(twin)
    testing.abort(comm)
    assert twin.is_aborted
    assert fake.calls("ncclCommRevoke") == 0 and fake.calls("ncclCommAbort") == 2

"""Registration of torch caching-allocator memory (csrc/nccl/caching_allocator_segments.h and the
backend's routing) against the scripted NCCL, with CPU tensors standing for segments.

What the allocator's trace tracker records (segments allocated and freed, expandable ranges
mapped and unmapped), which groups register such memory on first use, that torch's free of a
segment drops every registration over it before the memory goes, and that a registered memory
pool holds each segment once.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


KiB = 1 << 10
NCCL_INVALID_USAGE = 5  # ncclInvalidUsage


@pytest.fixture
def segments():
    """CPU tensors of `nbytes` recorded as caching-allocator segments until the test ends."""
    made: list[torch.Tensor] = []

    def make(nbytes: int) -> torch.Tensor:
        tensor = torch.empty(nbytes // 4, dtype=torch.float32)
        testing.note_segment_event("alloc", tensor)
        made.append(tensor)
        return tensor

    yield make
    for tensor in made:
        testing.note_segment_event("free", tensor)


def routes_of(register_caching_allocator: bool):
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), False, "group 'g'")
    return comm, testing.CommRoutes(comm, register_caching_allocator=register_caching_allocator)


def test_a_segment_is_registered_on_first_use_once_and_a_view_shares_it(fake, segments):
    comm, routes = routes_of(True)
    segment = segments(64 * KiB)
    for view in (segment, segment[:1024], segment[4096:], segment):
        assert routes.route("all_reduce", [view], [view]) == "group"
    assert fake.calls("ncclCommRegister") == 1
    stats = routes.registration_stats()
    seconds = stats.pop("first_use_seconds")
    assert stats == {
        "registrations": 1,
        "bytes": 64 * KiB,
        "first_uses": 1,
        "upgraded_windows": 0,
        "upgraded_window_bytes": 0,
    }
    assert seconds > 0  # the one registration's time
    testing.abort(comm)


def test_groups_that_did_not_ask_leave_ordinary_memory_alone(fake, segments):
    comm, routes = routes_of(False)
    segment = segments(64 * KiB)
    assert routes.route("all_reduce", [segment], [segment]) == "group"
    assert fake.calls("ncclCommRegister") == 0
    assert routes.registration_stats()["registrations"] == 0
    testing.abort(comm)


def test_torchs_free_of_a_segment_drops_its_registration_first(fake, segments):
    comm, routes = routes_of(True)
    segment = segments(64 * KiB)
    routes.route("all_reduce", [segment], [segment])
    testing.note_segment_event("free", segment)
    assert fake.calls("ncclCommDeregister") == 1
    assert comm._resource_count() == 0 and routes.registration_stats()["registrations"] == 0
    # The address handed out again is a new segment: registered anew, never the stale one.
    testing.note_segment_event("alloc", segment)
    routes.route("all_reduce", [segment], [segment])
    assert fake.calls("ncclCommRegister") == 2 and comm._resource_count() == 1
    testing.abort(comm)


def test_expandable_segments_register_by_mapped_range_and_unmap_drops_what_it_overlaps(fake):
    comm, routes = routes_of(True)
    reserved = torch.empty(64 * KiB // 4)  # one address range, mapped in two pieces
    first, second = reserved[: 8 * KiB], reserved[8 * KiB :]
    testing.note_segment_event("map", first)
    testing.note_segment_event("map", second)
    routes.route("all_reduce", [first[:100]], [first[:100]])
    routes.route("all_reduce", [second[:100]], [second[:100]])
    assert fake.calls("ncclCommRegister") == 2
    # A tensor across both mapped pieces lies in no one of them: NCCL copies it, unregistered.
    routes.route("all_reduce", [reserved], [reserved])
    assert fake.calls("ncclCommRegister") == 2
    # Unmapping part of the second piece drops that piece's registration, not the first's.
    testing.note_segment_event("unmap", second[:1024])
    assert fake.calls("ncclCommDeregister") == 1 and comm._resource_count() == 1
    assert testing.caching_allocator_allocations() == 1
    testing.note_segment_event("unmap", first)
    assert comm._resource_count() == 0 and testing.caching_allocator_allocations() == 0
    testing.abort(comm)


def test_nccl_memory_a_mempool_hands_out_stays_nccl_memory(fake):
    """A MemPool of NCCL memory reports its segments to the tracker too: they stay NCCL
    memory (windows may cover them), and the tracker's free does not forget them."""
    comm, routes = routes_of(True)
    nccl_memory = torch.empty(16 * KiB // 4)
    testing.record_allocation(nccl_memory)
    testing.note_segment_event("alloc", nccl_memory)
    assert testing.caching_allocator_allocations() == 0
    testing.note_segment_event("free", nccl_memory)
    routes.route("all_reduce", [nccl_memory], [nccl_memory])
    assert fake.calls("ncclCommRegister") == 1  # still known, as NCCL memory
    testing.forget_allocation(nccl_memory)
    assert comm._resource_count() == 0
    testing.abort(comm)


def test_a_registered_pool_holds_each_segment_once(fake, segments):
    comm, routes = routes_of(False)
    a, b = segments(16 * KiB), segments(32 * KiB)
    routes.route("all_reduce", [a], [a])  # not registered: the group did not ask
    buffers = routes.register_segments([a, b])
    assert fake.calls("ncclCommRegister") == 2 and comm._resource_count() == 2
    again = routes.register_segments([a, b])  # the same registrations, no new ones
    assert fake.calls("ncclCommRegister") == 2
    assert [x.handle for x in again] == [x.handle for x in buffers]
    stats = routes.registration_stats()
    stats.pop("first_use_seconds")
    assert stats == {
        "registrations": 2,
        "bytes": 48 * KiB,
        "first_uses": 0,
        "upgraded_windows": 0,
        "upgraded_window_bytes": 0,
    }
    testing.note_segment_event("free", a)  # freed while registered
    assert not buffers[0].is_valid and buffers[1].is_valid
    for buffer in buffers:
        buffer.close()  # as deregister_mem_pool does: a no-op for the freed one
    assert fake.calls("ncclCommDeregister") == 2 and comm._resource_count() == 0
    testing.abort(comm)


def test_memory_nccl_refuses_to_register_runs_unregistered_and_is_not_retried(fake, segments):
    """As NCCL before 2.29 refuses an expandable range of several physical allocations."""
    comm, routes = routes_of(True)
    segment = segments(64 * KiB)
    fake.fail_next("ncclCommRegister", NCCL_INVALID_USAGE)
    for _ in range(3):
        assert routes.route("all_reduce", [segment], [segment]) == "group"
    assert fake.calls("ncclCommRegister") == 1 and comm._resource_count() == 0
    fresh = segments(64 * KiB)  # other memory is still registered
    routes.route("all_reduce", [fresh], [fresh])
    assert fake.calls("ncclCommRegister") == 2 and comm._resource_count() == 1
    testing.abort(comm)


def test_every_free_reaches_the_communicators_not_only_the_first(fake):
    """Was: the table dropped its observers while telling them of the first free (a weak
    pointer moved onto itself), so later frees left their registrations behind."""
    comm, routes = routes_of(False)
    tensors = [torch.empty(4 * KiB) for _ in range(3)]
    for tensor in tensors:
        testing.record_allocation(tensor)
        routes.route("all_reduce", [tensor], [tensor])
    assert comm._resource_count() == 3
    for freed, tensor in enumerate(tensors, start=1):
        testing.forget_allocation(tensor)
        assert fake.calls("ncclCommDeregister") == freed
    assert comm._resource_count() == 0
    testing.abort(comm)


def test_a_stale_segment_record_gives_way_with_its_registrations(fake, segments):
    """A segment whose free went unseen (freed between torch's snapshot and its recording):
    whatever is recorded next at its address replaces it, and its registration goes first."""
    comm, routes = routes_of(True)
    memory = torch.empty(64 * KiB // 4)
    testing.note_segment_event("alloc", memory[: 4 * KiB])  # stale: 16 KiB at the address
    routes.route("all_reduce", [memory[:16]], [memory[:16]])
    assert comm._resource_count() == 1
    testing.note_segment_event("alloc", memory)  # a new 64 KiB segment there
    assert fake.calls("ncclCommDeregister") == 1 and comm._resource_count() == 0
    routes.route("all_reduce", [memory], [memory])  # the whole new segment is found
    assert comm._resource_count() == 1
    testing.record_allocation(memory)  # NCCL memory there now: the segment record goes too
    assert fake.calls("ncclCommDeregister") == 2 and comm._resource_count() == 0
    assert testing.caching_allocator_allocations() == 0
    testing.forget_allocation(memory)
    testing.abort(comm)


def test_a_snapshot_record_never_replaces_what_the_tracker_recorded(fake):
    """torch's snapshot may predate a free and a new segment at the same address: the record
    the tracker made as it happened stays, with its registration."""
    comm, routes = routes_of(True)
    memory = torch.empty(64 * KiB // 4)
    testing.note_segment_event("alloc", memory)
    routes.route("all_reduce", [memory], [memory])
    testing.note_segment_event("existing", memory[: 4 * KiB])  # an older, smaller one
    assert fake.calls("ncclCommDeregister") == 0 and comm._resource_count() == 1
    testing.note_segment_event("free", memory)
    assert comm._resource_count() == 0 and testing.caching_allocator_allocations() == 0
    testing.abort(comm)

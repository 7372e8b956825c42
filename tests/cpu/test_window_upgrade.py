"""The lazy window upgrade (csrc/backend/routing/window_upgrade.h) against the scripted NCCL.

When the ranks vote (the third run of an op shape, alike on every rank), what each rank votes
(the same buffers again, one tensor's own NCCL memory that NCCL can map, in no window yet), that
windows are registered only where every rank voted the same, and what becomes of them: the op
runs on NCCL's symmetric kernels, the memory's free closes them. The ranks' meeting is stood in
for by `agree`, which gets this rank's vote and returns the tally.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

import torch_nccl_core

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


MiB = 1 << 20
SIZE = 2  # ranks of the fake group
NCCL_INVALID_ARGUMENT = 4

pytestmark = pytest.mark.skipif(
    torch_nccl_core.one_sided_engine() != "nccl",
    reason="fake windows stay off the load/store engine only with NCCL >= 2.29's host API",
)


class Votes:
    """The ranks' meeting: the peers vote as this rank does, or as `peers` says."""

    def __init__(self, peers=None):
        self.mine: list[int] = []
        self.peers = peers

    def __call__(self, vote: int) -> int:
        self.mine.append(vote)
        return vote * SIZE if self.peers is None else vote + self.peers


@pytest.fixture
def memory():
    """CPU tensors of `nbytes` recorded as memory of `kind` until the test ends: "tensor", one
    tensor's own NCCL memory (torch_nccl_core.empty); "pool", a segment of NCCL memory a pool
    carves tensors from; "segment", a segment of torch's caching allocator."""
    made: list[tuple[torch.Tensor, str]] = []

    def make(nbytes: int, kind: str = "tensor") -> torch.Tensor:
        tensor = torch.empty(nbytes // 4, dtype=torch.float32)
        if kind == "segment":
            testing.note_segment_event("alloc", tensor)
        else:
            testing.record_allocation(tensor, per_tensor=kind == "tensor")
        made.append((tensor, kind))
        return tensor

    yield make
    for tensor, kind in made:
        if kind == "segment":
            testing.note_segment_event("free", tensor)
        else:
            testing.forget_allocation(tensor)


@pytest.fixture
def group(fake):
    comm = testing.create_communicator(SIZE, 0, timedelta(seconds=5), False, "group 'g'")
    routes = testing.CommRoutes(comm, window_upgrade=True)
    yield comm, routes
    testing.abort(comm)


def runs(routes, op, output, input, votes, times=3):
    return [routes.route(op, [output], [input], agree=votes) for _ in range(times)]


def test_the_third_run_on_the_same_buffer_makes_it_a_window(fake, group, memory):
    comm, routes = group
    x = memory(4 * MiB)
    votes = Votes()
    assert runs(routes, "all_reduce", x, x, votes, times=2) == ["group", "group"]
    assert votes.mine == [] and fake.calls("ncclCommWindowRegister") == 0
    assert runs(routes, "all_reduce", x, x, votes, times=1) == ["group"]  # symmetric kernels
    assert votes.mine == [1]
    assert fake.calls("ncclCommWindowRegister") == 1 and routes.twin is not None
    window = comm.find_window(x)
    assert window is not None and window.size == x.nbytes
    stats = routes.registration_stats()
    assert (stats["upgraded_windows"], stats["upgraded_window_bytes"]) == (1, 4 * MiB)
    # Later runs vote no more.
    runs(routes, "all_reduce", x, x, votes, times=5)
    assert votes.mine == [1] and fake.calls("ncclCommWindowRegister") == 1


def test_an_in_place_op_naming_its_tensor_once_votes_for_one_window(fake, group, memory):
    """all_reduce passes its tensor as the output alone."""
    comm, routes = group
    x = memory(4 * MiB)
    votes = Votes()
    for _ in range(3):
        routes.route("all_reduce", [x], [], agree=votes)
    assert votes.mine == [1] and comm.find_window(x) is not None


def test_apart_buffers_get_two_windows_and_the_vote_says_so(fake, group, memory):
    comm, routes = group
    output, input = memory(4 * MiB), memory(8 * MiB)
    votes = Votes()
    runs(routes, "reduce_scatter", output, input, votes)
    assert votes.mine == [SIZE + 1]  # two windows: a tally no mix of votes reaches
    assert fake.calls("ncclCommWindowRegister") == 2
    assert comm.find_window(output) is not None and comm.find_window(input) is not None


@pytest.mark.parametrize("where", ["inside", "across"])
def test_overlapping_buffers_vote_no(fake, group, memory, where):
    """An output inside its input (an in-place reduce_scatter_tensor: this rank's chunk, at
    another offset on each rank) or across its end gets no window."""
    _, routes = group
    whole = memory(16 * MiB)
    quarter = whole.numel() // 4
    input = whole[: 2 * quarter]
    output = input[quarter:] if where == "inside" else whole[quarter : 3 * quarter]
    votes = Votes()
    runs(routes, "reduce_scatter", output, input, votes)
    assert votes.mine == [0] and fake.calls("ncclCommWindowRegister") == 0


@pytest.mark.parametrize("peers", [0, SIZE + 1, 2 * SIZE])
def test_nothing_is_registered_unless_every_rank_votes_alike(fake, group, memory, peers):
    """A peer that cannot (0), one that would register two windows (a mixed tally) and a tally
    past this rank's own all leave every buffer alone on this rank."""
    _, routes = group
    x = memory(4 * MiB)
    votes = Votes(peers=peers)
    runs(routes, "all_reduce", x, x, votes)
    assert votes.mine == [1]
    assert fake.calls("ncclCommWindowRegister") == 0 and routes.twin is None


def test_other_buffers_at_each_run_vote_no(fake, group, memory):
    """The trigger counts the op shape, which every rank sees alike; the buffers are this rank's
    own, so the vote says whether they were the same again."""
    _, routes = group
    buffers = [memory(4 * MiB) for _ in range(3)]
    votes = Votes()
    for x in buffers:
        routes.route("all_reduce", [x], [x], agree=votes)
    assert votes.mine == [0] and fake.calls("ncclCommWindowRegister") == 0


def test_memory_nccl_cannot_map_votes_no(fake, group, memory):
    """torch's cudaMalloc segments have no cuMem handle (the driver's answer)."""
    _, routes = group
    x = memory(4 * MiB)
    votes = Votes()
    runs(routes, "all_reduce", x, x, votes, times=2)
    fake.fail_next("windowable", NCCL_INVALID_ARGUMENT)
    runs(routes, "all_reduce", x, x, votes, times=1)
    assert votes.mine == [0] and fake.calls("ncclCommWindowRegister") == 0


def test_memory_in_a_window_already_votes_no(fake, group, memory):
    comm, routes = group
    x = memory(8 * MiB)
    testing.register_window(comm, x[: x.numel() // 2], 0)  # overlaps the op's buffer
    votes = Votes()
    runs(routes, "all_reduce", x, x, votes)
    assert votes.mine == [0] and fake.calls("ncclCommWindowRegister") == 1


@pytest.mark.parametrize("tracked", [False, True])
def test_memory_other_tensors_get_after_this_one_votes_no(fake, memory, tracked):
    """A pool's segment and torch's segments hand a freed tensor's range to other tensors,
    maybe differently on each rank: never upgraded, whether the group tracks torch's segments
    or not. Memory in no table at all neither."""
    comm = testing.create_communicator(SIZE, 0, timedelta(seconds=5), False, "group 'g'")
    routes = testing.CommRoutes(comm, register_caching_allocator=tracked, window_upgrade=True)
    votes = Votes()
    for x in (memory(4 * MiB, "pool"), memory(8 * MiB, "segment"), torch.empty(4 * MiB)):
        runs(routes, "all_reduce", x, x, votes)
    assert votes.mine == [0, 0, 0] and fake.calls("ncclCommWindowRegister") == 0
    testing.abort(comm)


def test_a_freed_tensor_takes_its_window_with_it(fake, group, memory):
    comm, routes = group
    x = memory(4 * MiB)
    runs(routes, "all_reduce", x, x, Votes())
    assert comm.find_window(x) is not None
    testing.forget_allocation(x)  # as freeing the tensor's NCCL memory does
    assert comm.find_window(x) is None and fake.calls("ncclCommWindowDeregister") == 1
    testing.record_allocation(x, per_tensor=True)  # the fixture frees it once more


@pytest.mark.parametrize(
    ("op", "nbytes"),
    [
        ("all_reduce", MiB),  # below 2 MiB symmetric kernels gain nothing
        ("all_reduce", 64 * MiB),  # from 64 MiB the ring wins
        ("all_gather", 4 * MiB),  # the registered ring is never slower
        ("broadcast", 4 * MiB),
    ],
)
def test_ops_symmetric_kernels_do_not_speed_up_never_vote(fake, group, memory, op, nbytes):
    _, routes = group
    x = memory(nbytes)
    votes = Votes()
    runs(routes, op, x, x, votes)
    assert votes.mine == [] and fake.calls("ncclCommWindowRegister") == 0


@pytest.mark.parametrize("how", ["coalescing", "not_routable", "no_meeting"])
def test_ops_that_cannot_move_never_vote(fake, group, memory, how):
    _, routes = group
    x = memory(4 * MiB)
    votes = Votes()
    for _ in range(3):
        routes.route(
            "all_reduce",
            [x],
            [x],
            coalescing=how == "coalescing",
            routable=how != "not_routable",
            agree=None if how == "no_meeting" else votes,
        )
    assert votes.mine == [] and fake.calls("ncclCommWindowRegister") == 0


def test_groups_that_did_not_ask_never_vote(fake, memory):
    comm = testing.create_communicator(SIZE, 0, timedelta(seconds=5), False, "group 'g'")
    routes = testing.CommRoutes(comm)
    x = memory(4 * MiB)
    votes = Votes()
    runs(routes, "all_reduce", x, x, votes)
    assert votes.mine == [] and fake.calls("ncclCommWindowRegister") == 0
    testing.abort(comm)


def test_buffers_that_change_only_between_the_first_two_runs_vote_yes(fake, group, memory):
    """The vote asks whether the run before used the same buffers (DDP rebuilds its buckets
    after its first iteration)."""
    comm, routes = group
    first, kept = memory(4 * MiB), memory(4 * MiB)
    votes = Votes()
    for x in (first, kept, kept):
        routes.route("all_reduce", [x], [x], agree=votes)
    assert votes.mine == [1] and comm.find_window(kept) is not None
    assert comm.find_window(first) is None


def test_a_group_follows_at_most_64_op_shapes(fake, group, memory):
    _, routes = group
    x = memory(64 * MiB)
    votes = Votes()
    for shape in range(65):
        view = x[: (2 * MiB) // 4 + shape]  # a shape of its own, in the 2-64 MiB band
        runs(routes, "all_reduce", view, view, votes)
    assert len(votes.mine) == 64


def test_each_op_shape_votes_once_and_a_failed_vote_leaves_the_group_usable(fake, group, memory):
    comm, routes = group
    x, y = memory(4 * MiB), memory(8 * MiB)

    def meeting_fails(vote):
        raise RuntimeError("a peer never came")

    runs(routes, "all_reduce", x, x, Votes(), times=2)
    with pytest.raises(RuntimeError, match="never came"):
        routes.route("all_reduce", [x], [x], agree=meeting_fails)
    votes = Votes()
    assert runs(routes, "all_reduce", x, x, votes) == ["group"] * 3  # its vote is spent
    runs(routes, "all_reduce", y, y, votes)  # another shape votes on its own
    assert votes.mine == [1] and comm.find_window(y) is not None and comm.find_window(x) is None

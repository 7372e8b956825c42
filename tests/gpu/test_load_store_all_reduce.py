"""all_reduce through the package's load/store kernels (Options.all_reduce_kernels).

Each kernel (one-shot, two-shot) is forced in turn: every op, dtype and size of the collective
sweep runs on a group with it: what the kernels reduce (sum, product, min, max, avg; floating and
integer dtypes, up to 8 MiB) it runs, the rest goes to NCCL, and every result must be exact. The
tests also check that it is the path that ran (its kernel in a profile), its limit, unaligned
views, ops alternating between the caller's and the internal stream, CUDA graphs replayed with
new data, each replay checked, a group's first op captured; and that "auto" (the default) runs,
eagerly and captured, the kernel the measured table names for each size at this world size. The
kernels need peers that map each other's memory: elsewhere (other nodes) those tests skip, saying
so, and one test checks that NCCL then runs every all_reduce, right.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    ASYNC_MODES,
    all_ranks,
    assert_equal,
    complete,
    make_reduce_op,
    new_core_group,
    owned_group,
    profiled_kernels,
    rank_tensor,
    reduce_cases,
    reference_reduce,
)

KERNEL = "allReduceKernel"
LIMIT = 8 << 20  # bytes: LoadStoreCollectives::kMaxBytes
KERNELS = ("one_shot", "two_shot")


def _group(kernels: str | None) -> dist.ProcessGroup:
    return new_core_group(all_reduce_kernels=kernels)


def ran_kernel(kernels: list[str], which: str | None) -> bool:
    """Whether the profile shows `which` kernel of ours (None: any)."""
    # allReduceKernel<T, op, pack, two-shot>(nccl_core::LoadStoreArgs)
    flag = {"one_shot": "false>(", "two_shot": "true>(", None: ">("}[which]
    return any(KERNEL in k and flag in k for k in kernels)


@pytest.fixture(scope="module", params=KERNELS)
def kernel(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def forced(kernel):
    """A group whose all_reduces take `kernel` wherever it can run them."""
    yield from owned_group(_group(kernel))


@pytest.fixture(scope="module")
def runs_there(forced) -> None:
    """Skips (on every rank alike) where the peers do not all map each other's memory."""
    comm = torch_nccl_core.communicator(forced)
    if comm.lsa_size != comm.size:
        pytest.skip("the peers are not all load/store reachable: NCCL runs every all_reduce")


def _all_reduce(group, numel, dtype, rank, op="sum", *, salt=0, async_op=False):
    """Runs one all_reduce of `numel` elements; returns (result, expected)."""
    tensor = rank_tensor(numel, dtype, rank, salt=salt)
    expected = reference_reduce(all_ranks(numel, dtype, salt=salt), op)
    work = dist.all_reduce(tensor, op=make_reduce_op(op, dtype), group=group, async_op=async_op)
    complete(work, async_op)
    return tensor, expected


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("op", "dtype", "numel"), reduce_cases())
def test_every_op_dtype_and_size(rank, forced, runs_there, op, dtype, numel, async_op):
    tensor, expected = _all_reduce(forced, numel, dtype, rank, op, async_op=async_op)
    assert_equal(tensor, expected)


def test_it_is_the_path_that_runs_up_to_its_limit(rank, kernel, forced, runs_there):
    at_limit = LIMIT // 4  # float32 elements
    ran = {
        numel: profiled_kernels(lambda n=numel: _all_reduce(forced, n, torch.float32, rank))
        for numel in (1, at_limit, at_limit + 1)
    }
    off = _group("off")
    ran["off"] = profiled_kernels(lambda: _all_reduce(off, 1, torch.float32, rank))
    dist.destroy_process_group(off)
    assert ran_kernel(ran[1], kernel), ran[1]
    assert ran_kernel(ran[at_limit], kernel), ran[at_limit]
    assert not ran_kernel(ran[at_limit + 1], None), ran[at_limit + 1]
    assert not ran_kernel(ran["off"], None), ran["off"]


def test_without_load_store_peers_nccl_runs_it(rank, forced):
    """The cross-node contract: where the peers do not map each other's memory (other nodes),
    the option routes every all_reduce to NCCL, with the same results."""
    comm = torch_nccl_core.communicator(forced)
    if comm.lsa_size == comm.size:
        pytest.skip("the peers are load/store reachable: the kernel's own tests cover this group")
    results = []
    kernels = profiled_kernels(
        lambda: results.append(_all_reduce(forced, 1024, torch.float32, rank))
    )
    assert_equal(*results[0])
    assert not ran_kernel(kernels, None), kernels
    assert any("AllReduce" in k for k in kernels), kernels


@pytest.mark.parametrize("offset", [1, 3, 5, "by_rank"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64])
def test_unaligned_views(rank, forced, runs_there, offset, dtype):
    """Views off a 16-byte boundary take the element-wise loop; around them stays untouched.
    by_rank: aligned on even ranks only, over several blocks, so ranks that load differently
    must still split the elements alike."""
    numel = 4099 if offset != "by_rank" else 300001  # int64: 2.3 MiB, every block
    offset = (rank % 2) if offset == "by_rank" else offset
    base = torch.full((numel + offset + 5,), -1, dtype=dtype, device="cuda")
    view = base[offset : offset + numel]
    view.copy_(rank_tensor(numel, dtype, rank))
    dist.all_reduce(view, group=forced)
    expected = reference_reduce(all_ranks(numel, dtype), "sum")
    assert_equal(view, expected)
    assert (base[:offset] == -1).all() and (base[offset + numel :] == -1).all()


def test_ops_alternating_between_streams_without_waits(rank, forced, runs_there):
    """Sync ops run on the caller's stream, async ones on the internal stream; the kernel
    orders each after the previous one whichever stream it ran on."""
    sizes = (3, 5000, 200000, LIMIT // 4 - 64)  # from one block to all: the split changes
    results = []
    works = []
    for salt in range(40):
        numel = sizes[salt % len(sizes)] + salt
        tensor = rank_tensor(numel, torch.float32, rank, salt=salt)
        work = dist.all_reduce(tensor, group=forced, async_op=salt % 3 == 1)
        works.append(work)
        results.append((salt, numel, tensor))
    for work in works:
        if work is not None:
            work.wait()
    torch.cuda.synchronize()
    for salt, numel, tensor in results:
        expected = reference_reduce(all_ranks(numel, torch.float32, salt=salt), "sum")
        assert_equal(tensor, expected)


def test_graph_replays_reduce_new_data(rank, forced, runs_there):
    """Captured after eager ops (the staging exists), replayed 100 times, each replay with
    new data checked; two ops of different sizes in one graph."""
    small, large = 7, (1 << 20) + 3
    _all_reduce(forced, small, torch.float32, rank)  # eager traffic before the capture
    a = torch.zeros(small, device="cuda")
    b = torch.zeros(large, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(a, group=forced)
        dist.all_reduce(b, op=dist.ReduceOp.MAX, group=forced)
    mismatches = []
    for replay in range(100):
        a.copy_(rank_tensor(small, torch.float32, rank, salt=replay))
        b.copy_(rank_tensor(large, torch.bfloat16, rank, salt=replay))
        graph.replay()
        torch.cuda.synchronize()
        want_a = reference_reduce(all_ranks(small, torch.float32, salt=replay), "sum")
        want_b = reference_reduce(all_ranks(large, torch.bfloat16, salt=replay), "max")
        if not (torch.equal(a, want_a) and torch.equal(b, want_b)):
            mismatches.append(replay)
    ran = profiled_kernels(graph.replay)
    del graph
    assert mismatches == [], mismatches
    assert sum(KERNEL in k for k in ran) == 2, ran


def test_a_groups_first_op_may_be_captured(rank):
    """The staging is made with the communicator: a group's first all_reduce, captured, runs the
    kernel. Was: made by the first eager op, so a first op under capture went to NCCL."""
    group = _group("one_shot")
    dist.barrier(group=group)  # makes the communicator
    tensor = torch.zeros(64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(tensor, group=group)
    tensor.copy_(rank_tensor(64, torch.float32, rank))
    ran = profiled_kernels(graph.replay)
    result = tensor.clone()
    comm = torch_nccl_core.communicator(group)
    reachable = comm.lsa_size == comm.size
    del graph
    dist.destroy_process_group(group)
    assert_equal(result, reference_reduce(all_ranks(64, torch.float32), "sum"))
    assert ran_kernel(ran, "one_shot" if reachable else None) == reachable, ran


def _table(world_size: int, numel: int, capturing: bool) -> str | None:
    """The kernel the measured table gives a bf16 all_reduce of numel elements."""
    return torch_nccl_core._C._load_store_kernel("all_reduce", world_size, numel * 2, capturing)


def _boundaries(world_size: int, capturing: bool) -> list[int]:
    """Sizes on both sides of every change of the table's answer (and the smallest)."""
    candidates = [n for k in range(23) for n in (1 << k, (1 << k) + 1)]
    kept = {candidates[0]}
    for before, after in itertools.pairwise(candidates):
        if _table(world_size, before, capturing) != _table(world_size, after, capturing):
            kept |= {before, after}
    return sorted(kept)


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "graph"])
def test_auto_runs_each_size_where_the_table_says(rank, world_size, capturing):
    """Options(all_reduce_kernels="auto") follows the measured table at this world size, eagerly
    and captured: on both sides of each of its boundaries the op runs the kernel the table
    names, or NCCL, and reduces right. A world size the table lacks runs NCCL."""
    group = _group("auto")
    comm = torch_nccl_core.communicator(group)
    if comm.lsa_size != comm.size:
        dist.destroy_process_group(group)
        pytest.skip("the peers are not all load/store reachable: NCCL runs every all_reduce")
    sizes = _boundaries(world_size, capturing)
    wrong = {}
    for numel in sizes:
        tensor = rank_tensor(numel, torch.bfloat16, rank)
        dist.all_reduce(tensor, group=group)  # eager traffic before the capture
        graph = torch.cuda.CUDAGraph()
        if capturing:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                dist.all_reduce(tensor, group=group)
        tensor.copy_(rank_tensor(numel, torch.bfloat16, rank))
        ran = profiled_kernels(
            graph.replay if capturing else lambda t=tensor: dist.all_reduce(t, group=group)
        )
        del graph
        assert_equal(tensor, reference_reduce(all_ranks(numel, torch.bfloat16), "sum"))
        want = _table(world_size, numel, capturing)
        if not (ran_kernel(ran, want) if want else not ran_kernel(ran, None)):
            wrong[numel] = (want, ran)
    dist.destroy_process_group(group)
    assert wrong == {}, wrong  # a world size the table lacks: NCCL at every size

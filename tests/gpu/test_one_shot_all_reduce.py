"""all_reduce through the one-shot kernel (Options.one_shot_all_reduce).

Every op, dtype and size of the collective sweep runs on a group with it on: what the kernel
reduces (sum, product, min, max, avg; floating and integer dtypes, up to 256 KiB) it runs, the
rest goes to NCCL, and every result must be exact. The tests also check that it is the path that
ran (its kernel in a profile), its limit, unaligned views, ops alternating between the caller's
and the internal stream, and CUDA graphs replayed with new data, each replay checked. The kernel
needs peers that map each other's memory: elsewhere (other nodes) those tests skip, saying so,
and one test checks that NCCL then runs every all_reduce, right.
"""

from __future__ import annotations

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

KERNEL = "oneShotAllReduceKernel"
LIMIT = 256 << 10  # bytes: OneShotAllReduce::kMaxBytes


def _group(one_shot: bool | None) -> dist.ProcessGroup:
    return new_core_group(one_shot_all_reduce=one_shot)


@pytest.fixture(scope="module")
def one_shot():
    yield from owned_group(_group(True))


@pytest.fixture(scope="module")
def runs_there(one_shot) -> None:
    """Skips (on every rank alike) where the peers do not all map each other's memory."""
    comm = torch_nccl_core.communicator(one_shot)
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
def test_every_op_dtype_and_size(rank, one_shot, runs_there, op, dtype, numel, async_op):
    tensor, expected = _all_reduce(one_shot, numel, dtype, rank, op, async_op=async_op)
    assert_equal(tensor, expected)


def test_it_is_the_path_that_runs_up_to_its_limit(rank, one_shot, runs_there):
    at_limit = LIMIT // 4  # float32 elements
    ran = {
        numel: profiled_kernels(lambda n=numel: _all_reduce(one_shot, n, torch.float32, rank))
        for numel in (1, at_limit, at_limit + 1)
    }
    off = _group(False)
    ran["off"] = profiled_kernels(lambda: _all_reduce(off, 1, torch.float32, rank))
    dist.destroy_process_group(off)
    assert any(KERNEL in k for k in ran[1]), ran[1]
    assert any(KERNEL in k for k in ran[at_limit]), ran[at_limit]
    assert not any(KERNEL in k for k in ran[at_limit + 1]), ran[at_limit + 1]
    assert not any(KERNEL in k for k in ran["off"]), ran["off"]


def test_without_load_store_peers_nccl_runs_it(rank, one_shot):
    """The cross-node contract: where the peers do not map each other's memory (other nodes),
    the option routes every all_reduce to NCCL, with the same results."""
    comm = torch_nccl_core.communicator(one_shot)
    if comm.lsa_size == comm.size:
        pytest.skip("the peers are load/store reachable: the kernel's own tests cover this group")
    results = []
    kernels = profiled_kernels(
        lambda: results.append(_all_reduce(one_shot, 1024, torch.float32, rank))
    )
    assert_equal(*results[0])
    assert not any(KERNEL in k for k in kernels), kernels
    assert any("AllReduce" in k for k in kernels), kernels


@pytest.mark.parametrize("offset", [1, 2, 3, "by_rank"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64])
def test_unaligned_views(rank, one_shot, runs_there, offset, dtype):
    """Views off a 16-byte boundary take the element-wise loop; around them stays untouched.
    by_rank: aligned on even ranks only, over several blocks, so ranks that load differently
    must still split the elements alike."""
    numel = 4099 if offset != "by_rank" else 30001  # int64: 240 KiB, under the limit
    offset = (rank % 2) if offset == "by_rank" else offset
    base = torch.full((numel + offset + 5,), -1, dtype=dtype, device="cuda")
    view = base[offset : offset + numel]
    view.copy_(rank_tensor(numel, dtype, rank))
    dist.all_reduce(view, group=one_shot)
    expected = reference_reduce(all_ranks(numel, dtype), "sum")
    assert_equal(view, expected)
    assert (base[:offset] == -1).all() and (base[offset + numel :] == -1).all()


def test_ops_alternating_between_streams_without_waits(rank, one_shot, runs_there):
    """Sync ops run on the caller's stream, async ones on the internal stream; the kernel
    orders each after the previous one whichever stream it ran on."""
    sizes = (3, 5000, 20000, LIMIT // 4 - 64)  # from one block to all: the split changes
    results = []
    works = []
    for salt in range(40):
        numel = sizes[salt % len(sizes)] + salt
        tensor = rank_tensor(numel, torch.float32, rank, salt=salt)
        work = dist.all_reduce(tensor, group=one_shot, async_op=salt % 3 == 1)
        works.append(work)
        results.append((salt, numel, tensor))
    for work in works:
        if work is not None:
            work.wait()
    torch.cuda.synchronize()
    for salt, numel, tensor in results:
        expected = reference_reduce(all_ranks(numel, torch.float32, salt=salt), "sum")
        assert_equal(tensor, expected)


def test_graph_replays_reduce_new_data(rank, one_shot, runs_there):
    """Captured after eager ops (the staging exists), replayed 100 times, each replay with
    new data checked; two ops of different sizes in one graph."""
    small, large = 7, LIMIT // 8
    _all_reduce(one_shot, small, torch.float32, rank)  # eager first: makes the staging
    a = torch.zeros(small, device="cuda")
    b = torch.zeros(large, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(a, group=one_shot)
        dist.all_reduce(b, op=dist.ReduceOp.MAX, group=one_shot)
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


def test_first_op_under_capture_goes_to_nccl(rank):
    """Without staging (made collectively, never under capture) a captured op runs on NCCL."""
    group = _group(True)
    dist.barrier(group=group)
    tensor = torch.zeros(64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(tensor, group=group)
    tensor.copy_(rank_tensor(64, torch.float32, rank))
    ran = profiled_kernels(graph.replay)
    result = tensor.clone()
    del graph
    dist.destroy_process_group(group)
    assert_equal(result, reference_reduce(all_ranks(64, torch.float32), "sum"))
    assert not any(KERNEL in k for k in ran), ran

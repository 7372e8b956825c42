"""reduce_scatter_tensor through the copy engine (Options.copy_engine_reduce_scatter).

The path writes each peer's part into its staging memory chunk by chunk and reduces with ATen
kernels; these tests run it at every op, dtype and size of the collective sweep, across several
staging slots, next to other collectives and one-sided signals, and check that it is the path
that ran (its kernels appear in a profile, NCCL's reduce-scatter kernel does not).
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    ASYNC_MODES,
    SWEEP_NUMEL,
    WORLD_SIZE,
    all_ranks,
    assert_equal,
    assert_raised,
    load_store_reachable,
    needs_ranks,
    new_core_group,
    one_sided_refusal,
    owned_group,
    profiled_kernels,
    raised_by,
    rank_tensor,
    reduce_cases,
    reference_reduce,
    ring_peers,
    run_reduce_scatter,
)

MIB = 1 << 20
# Output elements (float32) of an op spanning five 32 MiB chunks, so that the
# three staging slots are reused within one op; odd, so the last chunk is short.
FIVE_CHUNKS = (128 * MIB) // 4 + 3


def _group(copy_engine: bool | None) -> dist.ProcessGroup:
    # The load/store kernels, which would take the small ones, off: the copy engine against NCCL.
    return new_core_group(copy_engine_reduce_scatter=copy_engine, gather_scatter_kernels=False)


@pytest.fixture(scope="module")
def always():
    yield from owned_group(_group(True))


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("op", "dtype", "numel"), reduce_cases())
def test_every_op_dtype_and_size(rank, always, op, dtype, numel, async_op):
    output, expected = run_reduce_scatter(always, numel, dtype, rank, op, async_op=async_op)
    assert_equal(output, expected)


def test_ops_spanning_many_slots_in_a_row(rank, always):
    results = [
        run_reduce_scatter(always, FIVE_CHUNKS, torch.float32, rank, salt=salt) for salt in range(3)
    ]
    for output, expected in results:
        assert_equal(output, expected)


def _profiled_reduce_scatter(group, numel: int, rank: int) -> tuple[list[str], bool]:
    """The kernels one reduce-scatter ran, and whether its result was right."""
    results = []
    kernels = profiled_kernels(
        lambda: results.append(run_reduce_scatter(group, numel, torch.float32, rank))
    )
    output, expected = results[0]
    return kernels, bool(torch.equal(output, expected))


@needs_ranks(2)  # the copy engine runs only between peers
def test_it_is_the_path_that_runs(rank):
    """Where the peers are load/store reachable, the copy engine's kernels run and NCCL's
    reduce-scatter does not; where they are not (other nodes), NCCL's runs, with the same result."""
    copy_engine, nccl = _group(True), _group(False)
    reachable = load_store_reachable(copy_engine)
    ran = {
        name: _profiled_reduce_scatter(group, SWEEP_NUMEL, rank)
        for name, group in (("copy_engine", copy_engine), ("nccl", nccl))
    }
    dist.destroy_process_group(copy_engine)
    dist.destroy_process_group(nccl)
    kernels = {name: k for name, (k, _) in ran.items()}
    assert all(right for _, right in ran.values()), ran
    assert any("waitKernel" in k for k in kernels["copy_engine"]) == reachable, kernels
    assert any("ReduceScatter" in k for k in kernels["copy_engine"]) != reachable, kernels
    assert any("ReduceScatter" in k for k in kernels["nccl"]), kernels["nccl"]
    assert not any("waitKernel" in k for k in kernels["nccl"]), kernels["nccl"]


@needs_ranks(2)  # the copy engine runs only between peers
def test_by_default_nccl_runs_it(rank):
    """Off unless asked (an FSDP2 step measured slower with it): NCCL's kernel runs small and
    large reduce_scatters. Was: the copy engine from 32 MiB of output."""
    group = _group(None)
    small = 1 << 16
    large = (32 * MIB) // 4  # float32 elements: the old threshold
    ran = {numel: _profiled_reduce_scatter(group, numel, rank) for numel in (small, large)}
    dist.destroy_process_group(group)
    assert all(right for _, right in ran.values()), ran
    for numel in (small, large):
        assert any("ReduceScatter" in k for k in ran[numel][0]), ran[numel][0]
        assert not any("waitKernel" in k for k in ran[numel][0]), ran[numel][0]


def test_between_other_collectives_on_a_side_stream(rank, always):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        first, first_expected = run_reduce_scatter(always, 4097, torch.float32, rank, salt=1)
        summed = rank_tensor(4097, torch.float32, rank)
        dist.all_reduce(summed, group=always)
        second, second_expected = run_reduce_scatter(
            always, 4097, torch.float32, rank, salt=2, async_op=True
        )
    side.synchronize()
    assert_equal(first, first_expected)
    assert_equal(summed, reference_reduce(all_ranks(4097, torch.float32), "sum"))
    assert_equal(second, second_expected)


@needs_ranks(2)  # the copy engine runs only between peers
def test_user_signals_are_not_taken_by_it(rank, world_size, always, windows):
    """One-sided signals and the reduce-scatter's signals count apart."""
    comm = torch_nccl_core.communicator(always)
    window_memory = torch_nccl_core.empty(SWEEP_NUMEL, group=always, window=True)
    window = comm.find_window(window_memory)
    source = rank_tensor(SWEEP_NUMEL, torch.float32, rank)
    peer, previous = ring_peers(rank)
    refusal = one_sided_refusal(always)
    if refusal is not None:  # across nodes without NCCL's one-sided API: refused, no copy engine
        error = raised_by(lambda: comm.put_signal(source, peer, window))
        output, expected = run_reduce_scatter(always, 4097, torch.float32, rank)
        torch.cuda.synchronize()
        window.close()
        assert_raised(error, NotImplementedError, refusal)
        assert_equal(output, expected)
        return
    comm.put_signal(source, peer, window)
    output, expected = run_reduce_scatter(always, 4097, torch.float32, rank)
    comm.wait_signal(torch_nccl_core.WaitSignalDesc(previous))
    torch.cuda.synchronize()
    received = window_memory.clone()
    dist.barrier(group=always)
    window.close()
    assert_equal(output, expected)
    assert_equal(received, rank_tensor(SWEEP_NUMEL, torch.float32, previous))


def test_captured_in_a_cuda_graph_it_leaves_the_op_to_nccl(rank, always):
    numel = 4097
    inputs = all_ranks(numel * WORLD_SIZE, torch.float32)
    source = inputs[rank].clone()
    output = torch.zeros(numel, device="cuda")
    dist.barrier(group=always)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.reduce_scatter_tensor(output, source, group=always)
    results = []
    for step in range(3):
        source.copy_(inputs[rank] * (step + 1))
        graph.replay()
        results.append(output.clone())
    torch.cuda.synchronize()
    total = reference_reduce(inputs, "sum")[rank * numel : (rank + 1) * numel]
    for step, result in enumerate(results):
        assert_equal(result, total * (step + 1))


@needs_ranks(2)  # a peer never joins
@pytest.mark.timeout(60, method="thread")
def test_aborting_the_group_ends_a_reduce_scatter_its_peer_never_joins(rank):
    """abort() is immediate (destroy would first give the op its timeout to finish). The path
    the lonely op takes is checked first: the copy engine where the peers are load/store
    reachable, NCCL's kernel elsewhere (other nodes), whose abort is then what is tested."""
    group = _group(True)
    reachable = load_store_reachable(group)
    kernels, right = _profiled_reduce_scatter(group, SWEEP_NUMEL, rank)  # staging on every rank
    assert right
    assert any("waitKernel" in k for k in kernels) == reachable, kernels
    side = torch.cuda.Stream()
    if rank == 0:
        with torch.cuda.stream(side):  # waits for the other ranks' parts, which never come
            dist.reduce_scatter_tensor(
                torch.empty(SWEEP_NUMEL, device="cuda"),
                torch.ones(SWEEP_NUMEL * WORLD_SIZE, device="cuda"),
                group=group,
            )
    group._get_backend(torch.device("cuda")).abort()
    side.synchronize()  # returns: the abort ended the waits
    dist.destroy_process_group(group)
    gc.collect()

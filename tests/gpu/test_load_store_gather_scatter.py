"""all_gather_into_tensor and reduce_scatter_tensor through the package's load/store kernels
(Options.gather_scatter_kernels).

The kernels are forced (True): every dtype (the all-gather moves bytes, so bool, complex and
float8 too), op and size runs on them where they can, the rest goes to NCCL, and every result
must be exact. The tests also check that it is the path that ran (its kernel in a profile) up to
its limit, in-place calls, unaligned views and parts of odd sizes, CUDA graphs replayed with new
data, and that the default follows the measured table, eagerly and captured. Elsewhere than
among load/store peers (other nodes) the kernels' tests skip, saying so.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import (
    ASYNC_MODES,
    COPY_DTYPES,
    SIZES,
    all_ranks,
    assert_equal,
    complete,
    concat,
    dtype_id,
    new_core_group,
    owned_group,
    poisoned,
    profiled_kernels,
    rank_tensor,
    reduce_cases,
    reference_reduce,
    require_dtype,
    run_reduce_scatter,
)

KERNELS = {"all_gather": "allGatherKernel", "reduce_scatter": "reduceScatterKernel"}
LIMIT = 8 << 20  # bytes of the larger tensor: LoadStoreCollectives::kMaxBytes


def ran_kernel(kernels: list[str], op: str) -> bool:
    return any(KERNELS[op] in k for k in kernels)


@pytest.fixture(scope="module")
def forced():
    yield from owned_group(new_core_group(gather_scatter_kernels=True, all_reduce_kernels="off"))


@pytest.fixture(scope="module")
def runs_there(forced) -> None:
    comm = torch_nccl_core.communicator(forced)
    if comm.lsa_size != comm.size:
        pytest.skip("the peers are not all load/store reachable: NCCL runs these ops")


def _all_gather(group, numel, dtype, rank, *, salt=0, async_op=False):
    expected = concat(all_ranks(numel, dtype, salt=salt))
    output = poisoned(expected)
    work = dist.all_gather_into_tensor(
        output, rank_tensor(numel, dtype, rank, salt=salt), group=group, async_op=async_op
    )
    complete(work, async_op)
    return output, expected


GATHER_CASES = [pytest.param(dt, 1023, id=dtype_id(dt)) for dt in COPY_DTYPES] + [
    pytest.param(torch.float32, n, id=f"float32-n{n}") for n in SIZES if n != 1023
]


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("dtype", "numel"), GATHER_CASES)
def test_all_gather_every_dtype_and_size(rank, forced, runs_there, dtype, numel, async_op):
    require_dtype(dtype)
    assert_equal(*_all_gather(forced, numel, dtype, rank, async_op=async_op))


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("op", "dtype", "numel"), reduce_cases())
def test_reduce_scatter_every_op_dtype_and_size(
    rank, forced, runs_there, op, dtype, numel, async_op
):
    assert_equal(*run_reduce_scatter(forced, numel, dtype, rank, op, async_op=async_op))


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_it_is_the_path_that_runs_up_to_its_limit(rank, world_size, forced, runs_there, op):
    """Up to LIMIT bytes of the larger tensor (float32), and not one part more."""
    at_limit = LIMIT // 4 // world_size

    def run(numel):
        if op == "all_gather":
            return _all_gather(forced, numel, torch.float32, rank)
        return run_reduce_scatter(forced, numel, torch.float32, rank)

    ran = {}
    for numel in (1, at_limit, at_limit + 1):
        results = []
        ran[numel] = profiled_kernels(lambda n=numel, out=results: out.append(run(n)))
        assert_equal(*results[0])
    assert ran_kernel(ran[1], op) and ran_kernel(ran[at_limit], op), ran
    assert not ran_kernel(ran[at_limit + 1], op), ran[at_limit + 1]


@pytest.mark.parametrize("numel", [4096, 4097])
def test_in_place(rank, world_size, forced, runs_there, numel):
    """all_gather whose input is this rank's part of the output; reduce_scatter whose output
    is this rank's part of the input; parts of whole 16-byte packs and not."""
    gathered = torch.empty(numel * world_size, device="cuda")
    part = gathered[rank * numel : (rank + 1) * numel]
    part.copy_(rank_tensor(numel, torch.float32, rank))
    dist.all_gather_into_tensor(gathered, part, group=forced)
    assert_equal(gathered, concat(all_ranks(numel, torch.float32)))
    inputs = all_ranks(numel * world_size, torch.float32)
    scattered = inputs[rank].clone()
    mine = scattered[rank * numel : (rank + 1) * numel]
    dist.reduce_scatter_tensor(mine, scattered, group=forced)
    want = reference_reduce(inputs, "sum")[rank * numel : (rank + 1) * numel]
    assert_equal(mine, want)


@pytest.mark.parametrize("numel", [7, 4096, 4099, 300001])
@pytest.mark.parametrize("offset", [0, 1, "by_rank"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64])
def test_unaligned_views_and_odd_parts(rank, world_size, forced, runs_there, offset, numel, dtype):
    """Views off a 16-byte boundary, and parts that are not a whole number of 16-byte packs,
    take the element-wise loop (by_rank: on odd ranks only, so that with 4096 ranks load
    differently); around them stays untouched."""
    offset = rank % 2 if offset == "by_rank" else offset
    total = numel * world_size
    if total * dtype.itemsize > LIMIT:
        pytest.skip("past the kernels' limit")
    base_in = torch.full((total + offset + 5,), -1, dtype=dtype, device="cuda")
    base_out = torch.full((total + offset + 5,), -1, dtype=dtype, device="cuda")
    source = base_in[offset : offset + numel]
    source.copy_(rank_tensor(numel, dtype, rank))
    gathered = base_out[offset : offset + total]
    dist.all_gather_into_tensor(gathered, source, group=forced)
    assert_equal(gathered, concat(all_ranks(numel, dtype)))
    inputs = all_ranks(total, dtype)
    scatter_in = base_in[offset : offset + total]
    scatter_in.copy_(inputs[rank])
    scatter_out = base_out[offset : offset + numel]
    dist.reduce_scatter_tensor(scatter_out, scatter_in, group=forced)
    assert_equal(scatter_out, reference_reduce(inputs, "sum")[rank * numel : (rank + 1) * numel])
    for base in (base_in, base_out):
        assert (base[:offset] == -1).all() and (base[offset + total :] == -1).all()


def test_graph_replays_move_new_data(rank, world_size, forced, runs_there):
    """Captured after eager ops, replayed 50 times with new data, each replay checked; an
    all_gather and a reduce_scatter in one graph, beside an all_reduce."""
    numel = 1000
    _all_gather(forced, numel, torch.float32, rank)  # eager traffic before the capture
    source = torch.zeros(numel, dtype=torch.bfloat16, device="cuda")
    gathered = torch.zeros(numel * world_size, dtype=torch.bfloat16, device="cuda")
    scatter_in = torch.zeros(numel * world_size, device="cuda")
    scatter_out = torch.zeros(numel, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        dist.all_gather_into_tensor(gathered, source, group=forced)
        dist.reduce_scatter_tensor(scatter_out, scatter_in, op=dist.ReduceOp.MAX, group=forced)
    mismatches = []
    for replay in range(50):
        source.copy_(rank_tensor(numel, torch.bfloat16, rank, salt=replay))
        inputs = all_ranks(numel * world_size, torch.float32, salt=replay)
        scatter_in.copy_(inputs[rank])
        graph.replay()
        torch.cuda.synchronize()
        want_gather = concat(all_ranks(numel, torch.bfloat16, salt=replay))
        want_scatter = reference_reduce(inputs, "max")[rank * numel : (rank + 1) * numel]
        if not (torch.equal(gathered, want_gather) and torch.equal(scatter_out, want_scatter)):
            mismatches.append(replay)
    ran = profiled_kernels(graph.replay)
    del graph
    assert mismatches == [], mismatches
    assert ran_kernel(ran, "all_gather") and ran_kernel(ran, "reduce_scatter"), ran


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_the_default_follows_the_table(rank, world_size, op, capturing):
    """Options left unset: on both sides of the table's limit at this world size (bf16), the
    op runs the kernel where the table names it, NCCL elsewhere, and is right."""
    group = new_core_group()
    comm = torch_nccl_core.communicator(group)
    if comm.lsa_size != comm.size:
        dist.destroy_process_group(group)
        pytest.skip("the peers are not all load/store reachable: NCCL runs these ops")
    table = torch_nccl_core._C._load_store_kernel
    parts = [1 << k for k in range(22)]
    limit = max(
        (n for n in parts if table(op, world_size, 2 * n * world_size, capturing)), default=None
    )
    wrong = {}
    for numel in sorted({1, 1000} | ({limit, limit + 1} if limit else set())):
        total = numel * world_size
        inputs = all_ranks(total if op == "reduce_scatter" else numel, torch.bfloat16)
        source = inputs[rank].clone()
        output = torch.zeros(
            numel if op == "reduce_scatter" else total, dtype=torch.bfloat16, device="cuda"
        )

        def call(out=output, src=source):
            if op == "all_gather":
                dist.all_gather_into_tensor(out, src, group=group)
            else:
                dist.reduce_scatter_tensor(out, src, group=group)

        call()  # eager traffic before the capture
        graph = torch.cuda.CUDAGraph()
        if capturing:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                call()
        output.zero_()
        ran = profiled_kernels(graph.replay if capturing else call)
        del graph
        if op == "all_gather":
            want = concat(inputs)
        else:
            want = reference_reduce(inputs, "sum")[rank * numel : (rank + 1) * numel]
        assert_equal(output, want)
        named = table(op, world_size, 2 * total, capturing) is not None
        if ran_kernel(ran, op) != named:
            wrong[numel] = (named, ran)
    dist.destroy_process_group(group)
    assert wrong == {}, wrong

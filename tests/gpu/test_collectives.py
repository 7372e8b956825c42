"""Every collective on the default nccl_core group, against a reference computed locally.

Sweeps: each op x dtype at one odd size, each size (0, 1, 1023, 4097, 1M) at one dtype, sync
and async, both roots for rooted collectives, even and uneven lists where torch allows them.
"""

from __future__ import annotations

import time
import warnings
from functools import partial

import pytest
import torch
import torch.distributed as dist

from .helpers import (
    ASYNC_MODES,
    COMPLEX_DTYPES,
    COPY_DTYPES,
    INT_DTYPES,
    NUMERIC_DTYPES,
    ROOT_MODES,
    SWEEP_NUMEL,
    WORLD_SIZE,
    all_ranks,
    assert_equal,
    assert_refused,
    complete,
    concat,
    dtype_cases,
    dtype_id,
    make_reduce_op,
    needs_ranks,
    poisoned,
    rank_tensor,
    reduce_cases,
    reference_reduce,
    require_dtype,
    run_reduce_scatter,
)

REDUCE_CASES = reduce_cases()
# list collectives: even sizes run sync, uneven sizes (rank r holds numel + 2r) run async
LAYOUTS = [pytest.param(False, False, id="even-sync"), pytest.param(True, True, id="uneven-async")]


def _sizes(numel: int, uneven: bool) -> list[int]:
    return [numel + (2 * r if uneven else 0) for r in range(WORLD_SIZE)]


def _deprecated(call):
    """all_reduce_coalesced / all_gather_coalesced warn that they will be deprecated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return call()


# --- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("op", "dtype", "numel"), REDUCE_CASES)
def test_all_reduce(rank, op, dtype, numel, async_op):
    tensor = rank_tensor(numel, dtype, rank)
    expected = reference_reduce(all_ranks(numel, dtype), op)
    complete(dist.all_reduce(tensor, op=make_reduce_op(op, dtype), async_op=async_op), async_op)
    assert_equal(tensor, expected)


@pytest.mark.parametrize(("root", "async_op"), ROOT_MODES)
@pytest.mark.parametrize(("op", "dtype", "numel"), REDUCE_CASES)
def test_reduce(rank, op, dtype, numel, root, async_op):
    tensor = rank_tensor(numel, dtype, rank)
    expected = reference_reduce(all_ranks(numel, dtype), op)
    work = dist.reduce(tensor, dst=root, op=make_reduce_op(op, dtype), async_op=async_op)
    complete(work, async_op)
    if rank == root:  # only the root's buffer is defined afterwards
        assert_equal(tensor, expected)


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("op", "dtype", "numel"), REDUCE_CASES)
def test_reduce_scatter_tensor(rank, op, dtype, numel, async_op):
    output, expected = run_reduce_scatter(None, numel, dtype, rank, op, async_op=async_op)
    assert_equal(output, expected)


@pytest.mark.parametrize(("uneven", "async_op"), LAYOUTS)
@pytest.mark.parametrize(("op", "dtype", "numel"), REDUCE_CASES)
def test_reduce_scatter_list(rank, op, dtype, numel, uneven, async_op):
    sizes = _sizes(numel, uneven)
    # inputs[s][r]: what rank s contributes to the chunk that rank r receives
    inputs = [
        [rank_tensor(sizes[r], dtype, s, salt=r) for r in range(WORLD_SIZE)]
        for s in range(WORLD_SIZE)
    ]
    expected = reference_reduce([inputs[s][rank] for s in range(WORLD_SIZE)], op)
    output = poisoned(expected)
    work = dist.reduce_scatter(
        output, inputs[rank], op=make_reduce_op(op, dtype), async_op=async_op
    )
    complete(work, async_op)
    assert_equal(output, expected)


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        ("sum", torch.float32),
        ("max", torch.int32),
        ("avg", torch.bfloat16),
        ("premul_sum_scalar", torch.float16),
    ],
    ids=["sum-float32", "max-int32", "avg-bfloat16", "premul_sum_scalar-float16"],
)
def test_all_reduce_coalesced(rank, op, dtype, async_op):
    shapes = [(1,), (1023,), (3, 5), (0,), (4097,)]
    tensors = [rank_tensor(s, dtype, rank, salt=i) for i, s in enumerate(shapes)]
    expected = [reference_reduce(all_ranks(s, dtype, salt=i), op) for i, s in enumerate(shapes)]
    reduce_op = make_reduce_op(op, dtype)
    work = _deprecated(lambda: dist.all_reduce_coalesced(tensors, op=reduce_op, async_op=async_op))
    complete(work, async_op)
    for actual, want in zip(tensors, expected, strict=True):
        assert_equal(actual, want)


@pytest.mark.parametrize("op", ["min", "max"])
def test_all_reduce_bool(rank, op):
    tensor = rank_tensor(SWEEP_NUMEL, torch.bool, rank)
    expected = reference_reduce(all_ranks(SWEEP_NUMEL, torch.bool), op)
    dist.all_reduce(tensor, op=make_reduce_op(op, torch.bool))
    assert_equal(tensor, expected)


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", COMPLEX_DTYPES, ids=dtype_id)
def test_all_reduce_complex(rank, dtype, op):
    tensor = rank_tensor(SWEEP_NUMEL, dtype, rank)
    expected = reference_reduce(all_ranks(SWEEP_NUMEL, dtype), op)
    dist.all_reduce(tensor, op=make_reduce_op(op, dtype))
    assert_equal(tensor, expected)


@pytest.mark.parametrize("op", ["product", "min", "max"])
def test_all_reduce_complex_refuses_ordering_ops(rank, op):
    tensor = rank_tensor(16, torch.complex64, rank)
    # torch itself refuses these before the backend sees them (ValueError); ours is a TypeError
    assert_refused(
        lambda: dist.all_reduce(tensor, op=make_reduce_op(op, tensor.dtype)),
        (TypeError, ValueError),
        r"(?i)complex",
    )


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=dtype_id)
def test_avg_refuses_integers(rank, dtype):
    assert_refused(
        lambda: dist.all_reduce(rank_tensor(16, dtype, rank), op=dist.ReduceOp.AVG),
        TypeError,
        r"(?i)avg|average",
    )


# --- data movement ----------------------------------------------------------------------------


@pytest.mark.parametrize(("root", "async_op"), ROOT_MODES)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(COPY_DTYPES))
def test_broadcast(rank, dtype, numel, root, async_op):
    require_dtype(dtype)
    tensor = rank_tensor(numel, dtype, rank)
    complete(dist.broadcast(tensor, src=root, async_op=async_op), async_op)
    assert_equal(tensor, rank_tensor(numel, dtype, root))


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(COPY_DTYPES))
def test_all_gather_into_tensor(rank, dtype, numel, async_op):
    require_dtype(dtype)
    expected = concat(all_ranks(numel, dtype))
    output = poisoned(expected)
    work = dist.all_gather_into_tensor(output, rank_tensor(numel, dtype, rank), async_op=async_op)
    complete(work, async_op)
    assert_equal(output, expected)


@pytest.mark.parametrize(("uneven", "async_op"), LAYOUTS)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(COPY_DTYPES))
def test_all_gather_list(rank, dtype, numel, uneven, async_op):
    require_dtype(dtype)
    sizes = _sizes(numel, uneven)
    expected = [rank_tensor(sizes[r], dtype, r) for r in range(WORLD_SIZE)]
    outputs = [poisoned(e) for e in expected]
    complete(dist.all_gather(outputs, expected[rank].clone(), async_op=async_op), async_op)
    for actual, want in zip(outputs, expected, strict=True):
        assert_equal(actual, want)


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bfloat16], ids=dtype_id)
def test_all_gather_coalesced(rank, dtype, async_op):
    shapes = [(1,), (1023,), (3, 5), (4097,)]
    inputs = [rank_tensor(s, dtype, rank, salt=i) for i, s in enumerate(shapes)]
    expected = [
        [rank_tensor(s, dtype, r, salt=i) for i, s in enumerate(shapes)] for r in range(WORLD_SIZE)
    ]
    outputs = [[poisoned(e) for e in per_rank] for per_rank in expected]
    work = _deprecated(lambda: dist.all_gather_coalesced(outputs, inputs, async_op=async_op))
    complete(work, async_op)
    for actual_list, want_list in zip(outputs, expected, strict=True):
        for actual, want in zip(actual_list, want_list, strict=True):
            assert_equal(actual, want)


@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(NUMERIC_DTYPES))
def test_all_to_all_list(rank, dtype, numel, async_op):
    def chunk(src: int, dst: int) -> torch.Tensor:
        """What rank src sends to rank dst; no two chunks have the same size."""
        return rank_tensor(numel + src + 2 * dst, dtype, src, salt=dst)

    inputs = [chunk(rank, dst) for dst in range(WORLD_SIZE)]
    expected = [chunk(src, rank) for src in range(WORLD_SIZE)]
    outputs = [poisoned(e) for e in expected]
    complete(dist.all_to_all(outputs, inputs, async_op=async_op), async_op)
    for actual, want in zip(outputs, expected, strict=True):
        assert_equal(actual, want)


@pytest.mark.parametrize(("uneven", "async_op"), LAYOUTS)
@pytest.mark.parametrize(("dtype", "rows"), dtype_cases(NUMERIC_DTYPES))
def test_all_to_all_single(rank, dtype, rows, uneven, async_op):
    width = 3  # rows of 3 elements: splits count rows, not elements
    splits = [
        [rows + (src + 2 * dst if uneven else 0) for dst in range(WORLD_SIZE)]
        for src in range(WORLD_SIZE)
    ]
    inputs = [rank_tensor((sum(splits[src]), width), dtype, src) for src in range(WORLD_SIZE)]
    expected = concat([inputs[src].split(splits[src])[rank] for src in range(WORLD_SIZE)])
    output = poisoned(expected)
    in_splits = splits[rank] if uneven else None
    out_splits = [splits[src][rank] for src in range(WORLD_SIZE)] if uneven else None
    work = dist.all_to_all_single(
        output,
        inputs[rank],
        output_split_sizes=out_splits,
        input_split_sizes=in_splits,
        async_op=async_op,
    )
    complete(work, async_op)
    assert_equal(output, expected)


@pytest.mark.parametrize(("root", "async_op"), ROOT_MODES)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(NUMERIC_DTYPES))
def test_gather(rank, dtype, numel, root, async_op):
    expected = all_ranks(numel, dtype)
    gather_list = [poisoned(e) for e in expected] if rank == root else None
    work = dist.gather(expected[rank].clone(), gather_list, dst=root, async_op=async_op)
    complete(work, async_op)
    if rank == root:
        for actual, want in zip(gather_list, expected, strict=True):
            assert_equal(actual, want)


@pytest.mark.parametrize(("root", "async_op"), ROOT_MODES)
@pytest.mark.parametrize(("dtype", "numel"), dtype_cases(NUMERIC_DTYPES))
def test_scatter(rank, dtype, numel, root, async_op):
    # the root's data, one chunk per receiving rank
    chunks = [rank_tensor(numel, dtype, root, salt=r) for r in range(WORLD_SIZE)]
    output = poisoned(chunks[rank])
    work = dist.scatter(output, chunks if rank == root else None, src=root, async_op=async_op)
    complete(work, async_op)
    assert_equal(output, chunks[rank])


# --- barrier and coalescing -------------------------------------------------------------------


@needs_ranks(2)
def test_barrier_waits_for_every_rank(rank):
    late_s = 0.5
    dist.barrier()  # line the ranks up
    if rank == WORLD_SIZE - 1:
        time.sleep(late_s)
    start = time.monotonic()
    dist.barrier()
    waited = time.monotonic() - start
    dist.barrier(async_op=True).wait()
    if rank == 0:
        assert waited >= late_s / 2, (
            f"barrier returned after {waited:.3f}s, before the last rank arrived"
        )


def _coalesced_calls(kind: str, rank: int) -> tuple[list, list, list]:
    """Collectives of one kind to issue together: (calls, buffers they fill, expected)."""
    numels = (1, 1023, 4097)
    dtype = torch.float32
    if kind == "all_reduce":
        buffers = [rank_tensor(n, dtype, rank, salt=i) for i, n in enumerate(numels)]
        expected = [
            reference_reduce(all_ranks(n, dtype, salt=i), "sum") for i, n in enumerate(numels)
        ]
        return [partial(dist.all_reduce, b) for b in buffers], buffers, expected
    if kind == "all_gather_into_tensor":
        expected = [concat(all_ranks(n, dtype, salt=i)) for i, n in enumerate(numels)]
        buffers = [poisoned(e) for e in expected]
        inputs = [rank_tensor(n, dtype, rank, salt=i) for i, n in enumerate(numels)]
        function = dist.all_gather_into_tensor
    else:
        everyone = [all_ranks(n * WORLD_SIZE, dtype, salt=i) for i, n in enumerate(numels)]
        expected = [
            reference_reduce(e, "sum")[rank * n : (rank + 1) * n]
            for e, n in zip(everyone, numels, strict=True)
        ]
        buffers = [poisoned(e) for e in expected]
        inputs = [e[rank] for e in everyone]
        function = dist.reduce_scatter_tensor
    calls = [partial(function, b, x) for b, x in zip(buffers, inputs, strict=True)]
    return calls, buffers, expected


@pytest.mark.parametrize("with_device", [False, True], ids=["fast-path", "start-end"])
@pytest.mark.parametrize("async_op", ASYNC_MODES)
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"])
def test_coalescing_manager(rank, device, kind, async_op, with_device):
    calls, buffers, expected = _coalesced_calls(kind, rank)
    # with a device, torch also brackets the ops with start/end_coalescing on the backend
    with dist._coalescing_manager(device=device if with_device else None, async_ops=async_op) as cm:
        for call in calls:
            call()
    if async_op:
        cm.wait()
    for actual, want in zip(buffers, expected, strict=True):
        assert_equal(actual, want)

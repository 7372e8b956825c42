"""Bad arguments are refused at once with a clear exception, and the group stays usable.

Every rank makes the same bad call, so all refuse it before NCCL is involved; a correct
all_reduce on the same group follows. Where torch.distributed may intercept the call before
the backend sees it, either exception type is accepted and the message is not checked.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist

from .helpers import WORLD_SIZE, assert_raised, assert_refused, raised_by

SIZE_WORDS = r"(?i)size|numel|element|count|split"
LIST_WORDS = r"(?i)per rank|world size|length|number of"


def _cuda(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # contents are irrelevant to a refused call (and torch.empty works for every dtype)
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _other_gpu(*shape: int) -> torch.Tensor:
    """A tensor on another GPU than this rank's."""
    other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
    return torch.empty(*shape, device=torch.device("cuda", other))


def _all_reduce(dtype: torch.dtype, op: dist.ReduceOp = dist.ReduceOp.SUM) -> None:
    dist.all_reduce(_cuda(4, dtype=dtype), op=op)


def _with_root(options_type, root: int):
    options = options_type()
    options.rootRank = root
    return options


# name -> (call, accepted exception types, regex the message must match or None)
BAD_CALLS = {
    "cpu-tensor": (lambda: dist.all_reduce(torch.empty(4)), (ValueError, RuntimeError), None),
    "sparse-tensor": (
        lambda: dist.all_reduce(_cuda(4).to_sparse()),
        (ValueError, RuntimeError),
        None,
    ),
    "wrong-gpu": (lambda: dist.all_reduce(_other_gpu(4)), ValueError, r"(?i)device|cuda"),
    "non-contiguous": (lambda: dist.all_reduce(_cuda(4, 4).t()), ValueError, r"(?i)contiguous"),
    "all-gather-output-size": (
        lambda: dist.all_gather_into_tensor(_cuda(4 * WORLD_SIZE + 1), _cuda(4)),
        ValueError,
        SIZE_WORDS,
    ),
    "reduce-scatter-input-size": (
        lambda: dist.reduce_scatter_tensor(_cuda(4), _cuda(4 * WORLD_SIZE + 1)),
        ValueError,
        SIZE_WORDS,
    ),
    "all-gather-list-length": (
        lambda: dist.all_gather([_cuda(4)] * (WORLD_SIZE + 1), _cuda(4)),
        ValueError,
        LIST_WORDS,
    ),
    "all-to-all-splits": (
        lambda: dist.all_to_all_single(
            _cuda(4), _cuda(4), output_split_sizes=[1, 1], input_split_sizes=[2, 2]
        ),
        ValueError,
        SIZE_WORDS,
    ),
    "dtype-mismatch": (
        lambda: dist.all_gather_into_tensor(_cuda(4 * WORLD_SIZE), _cuda(4, dtype=torch.float16)),
        TypeError,
        r"(?i)dtype",
    ),
    # torch.distributed's functions check roots first; the ProcessGroup reaches the backend
    "broadcast-root-past-end": (
        lambda: dist.group.WORLD.broadcast(
            [_cuda(4)], _with_root(dist.BroadcastOptions, WORLD_SIZE)
        ),
        ValueError,
        r"(?i)root|rank",
    ),
    "broadcast-root-negative": (
        lambda: dist.group.WORLD.broadcast([_cuda(4)], _with_root(dist.BroadcastOptions, -1)),
        ValueError,
        r"(?i)root|rank",
    ),
    "reduce-root-past-end": (
        lambda: dist.group.WORLD.reduce([_cuda(4)], _with_root(dist.ReduceOptions, WORLD_SIZE)),
        ValueError,
        r"(?i)root|rank",
    ),
    "op-band": (partial(_all_reduce, torch.int32, dist.ReduceOp.BAND), ValueError, r"(?i)BAND"),
    "op-bor": (partial(_all_reduce, torch.int32, dist.ReduceOp.BOR), ValueError, r"(?i)BOR"),
    "op-bxor": (partial(_all_reduce, torch.int32, dist.ReduceOp.BXOR), ValueError, r"(?i)BXOR"),
    "dtype-int16": (partial(_all_reduce, torch.int16), TypeError, r"(?i)int16|short"),
    "dtype-uint16": (partial(_all_reduce, torch.uint16), TypeError, r"(?i)uint16"),
}


ONE_GPU = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=ONE_GPU) if c == "wrong-gpu" else c for c in BAD_CALLS]
)
def test_bad_call_is_refused_and_group_stays_usable(case):
    call, types, match = BAD_CALLS[case]
    assert_refused(call, types, match)


def test_nan_check_looks_only_at_data_a_rank_sends(rank, monkeypatch):
    """TORCH_NCCL_NAN_CHECK=1: a NaN to send is refused on every rank before NCCL runs; a
    broadcast's receive buffer on the other ranks may hold anything."""
    monkeypatch.setenv("TORCH_NCCL_NAN_CHECK", "1")
    checked = dist.new_group(backend="nccl_core")
    dirty = torch.full((4,), float("nan"), device="cuda")
    error = raised_by(lambda: dist.all_reduce(dirty.clone(), group=checked))
    received = torch.zeros(4, device="cuda") if rank == 0 else dirty.clone()
    dist.broadcast(received, src=0, group=checked)
    torch.cuda.synchronize()
    dist.destroy_process_group(checked)
    assert_raised(error, ValueError, r"allreduce: tensor 0 to send holds NaN")
    assert torch.equal(received, torch.zeros(4, device="cuda"))

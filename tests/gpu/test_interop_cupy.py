"""torch_nccl_core.interop.cupy: CuPy arrays on NCCL memory."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core

from .helpers import all_ranks, assert_equal, rank_tensor, reference_reduce

cupy = pytest.importorskip("cupy")
interop = torch_nccl_core.interop.cupy

NCCL_FLOAT64 = 8  # ncclFloat64


@pytest.mark.parametrize("order", ["C", "F"])
def test_empty_and_resolve_array(order):
    a = interop.empty((3, 5), dtype=cupy.float64, order=order)
    ptr, count, nccl_dtype, device = interop.resolve_array(a)
    assert a.shape == (3, 5) and a.dtype == cupy.float64
    assert a.flags.c_contiguous == (order == "C") and a.flags.f_contiguous == (order == "F")
    assert (ptr, count, nccl_dtype, device) == (a.data.ptr, 15, NCCL_FLOAT64, a.device.id)
    assert torch_nccl_core.resolve_tensor(torch.from_dlpack(a.ravel(order="K")))[0] == ptr


def test_cupy_array_runs_collectives_registered(rank):
    a = interop.empty(4097, dtype="float32")
    t = torch.from_dlpack(a)  # same memory: NCCL memory, registered on first use
    t.copy_(rank_tensor(4097, torch.float32, rank))
    dist.all_reduce(t)
    assert_equal(torch.from_dlpack(a), reference_reduce(all_ranks(4097, torch.float32), "sum"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="order"):
        interop.empty(4, order="K")
    with pytest.raises(TypeError, match=r"cupy\.ndarray"):
        interop.resolve_array(torch.ones(2))
    with pytest.raises(TypeError):
        interop.empty(4, dtype=cupy.int16)

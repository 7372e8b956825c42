"""TORCH_NCCL_NAN_CHECK's check of the tensors an op sends (backend/ops/nan_check.h), on CPU
tensors: launch() runs the same function on an op's CUDA tensors before numbering it."""

from __future__ import annotations

import pytest
import torch

_testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


refuse_nan = _testing.refuse_nan
NAN = float("nan")


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
     torch.complex64],
)  # fmt: skip
def test_a_nan_to_send_is_refused_naming_the_op_and_the_tensor(dtype):
    clean = torch.zeros(8, dtype=dtype)
    dirty = torch.zeros(8, dtype=dtype)
    dirty[5] = NAN
    with pytest.raises(ValueError, match=r"nccl_core allreduce: tensor 1 to send holds NaN"):
        refuse_nan("allreduce", [clean, dirty])


def test_the_tensor_named_counts_every_tensor_sent():
    dirty = torch.tensor([0.0, NAN])
    with pytest.raises(ValueError, match=r"nccl_core send: tensor 2 to send holds NaN"):
        refuse_nan("send", [torch.zeros(2), torch.arange(2), dirty])


def test_finite_and_integer_tensors_pass():
    refuse_nan("allreduce", [torch.tensor([1.0, float("inf"), -float("inf")])])
    refuse_nan("allreduce", [torch.arange(8, dtype=torch.int32), torch.ones(3, dtype=torch.bool)])
    refuse_nan("send", [])

"""Argument checks of the NCCL-memory API that need no GPU (they fail before CUDA is touched)."""

import pytest
import torch

import torch_nccl_core


def test_empty_rejects_a_bad_memory_order():
    with pytest.raises(ValueError, match="morder must be 'C' or 'F'"):
        torch_nccl_core.empty(2, 3, device=0, morder="K")


def test_empty_rejects_a_non_cuda_device():
    with pytest.raises(ValueError, match="CUDA devices, got device cpu"):
        torch_nccl_core.empty(4, device="cpu")


def test_empty_rejects_non_integer_sizes():
    with pytest.raises(TypeError, match="sizes must be integers"):
        torch_nccl_core.empty(2.5, device=0)


def test_empty_rejects_a_dtype_nccl_lacks():
    with pytest.raises(TypeError, match="Short has no NCCL equivalent"):
        torch_nccl_core.empty(4, dtype=torch.int16, device=0)


def test_empty_rejects_negative_sizes():
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        torch_nccl_core.empty((2, -1), device=0)


def test_resolve_tensor_rejects_non_tensors_and_cpu_tensors():
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor"):
        torch_nccl_core.resolve_tensor([1, 2])
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        torch_nccl_core.resolve_tensor(torch.ones(2))


def test_mem_pool_rejects_a_non_cuda_device():
    with pytest.raises(ValueError, match="CUDA devices"):
        torch_nccl_core.mem_pool("cpu")

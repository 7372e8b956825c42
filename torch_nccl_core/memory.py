"""Tensors on NCCL-allocated memory (``ncclMemAlloc``)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from . import _C
from .communicator import WindowFlag, communicator

__all__ = ["empty", "mem_pool", "resolve_tensor"]


def _cuda_device(device: torch.device | int | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"NCCL memory lives on CUDA devices, got device {device}")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _sizes(size: tuple) -> list[int]:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise TypeError(f"sizes must be integers, got {size!r}")
    return list(size)


def empty(
    *size: int,
    dtype: torch.dtype | None = None,
    device: torch.device | int | str | None = None,
    morder: str = "C",
    group: dist.ProcessGroup | None = None,
    window: bool = False,
    window_flags: WindowFlag = WindowFlag.COLL_SYMMETRIC,
) -> torch.Tensor:
    """An uninitialized tensor on NCCL-allocated memory, freed when it is garbage collected.

    Ops of an ``nccl_core`` group on such a tensor register its memory with the group's
    communicator on first use and run on it in place (zero-copy).

    Args:
        size: the shape, as integers or one sequence.
        dtype: defaults to ``torch.get_default_dtype()``.
        device: a CUDA device; defaults to the current one (with ``window``: the group's).
        morder: ``"C"`` (row-major) or ``"F"`` (column-major strides).
        group: with ``window``, the group whose communicator registers the window (default: the
            world group).
        window: register the memory as a window of ``group`` (collective: every rank of the group
            calls ``empty`` with the same size together). The window lives as long as the
            tensor's memory; ``communicator(group).find_window(t)`` returns it.
        window_flags: flags of that window; ``COLL_SYMMETRIC`` lets collectives on it use NCCL's
            symmetric kernels.

    Raises:
        ValueError: ``morder`` is not ``"C"``/``"F"``, the device is not CUDA or not the group's,
            a size is negative, or ``group`` is given without ``window``.
        TypeError: NCCL has no equivalent of ``dtype`` (e.g. int16), or a size is not an integer.
        NotImplementedError: ``window`` where NCCL has no windows on this platform.
    """
    if morder not in ("C", "F"):
        raise ValueError(f"morder must be 'C' or 'F', got {morder!r}")
    if group is not None and not window:
        raise ValueError("group only applies to window=True allocations")
    sizes = _sizes(size)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    if not window:
        return _C.empty(sizes, dtype, _cuda_device(device).index, morder == "F")
    comm = communicator(group)
    device = _cuda_device(device if device is not None else comm.device)
    if device.index != comm.device:
        raise ValueError(f"the group's communicator is on cuda:{comm.device}, not on {device}")
    tensor = _C.empty(sizes, dtype, device.index, morder == "F")
    if comm.register_window(tensor, int(window_flags)) is None:
        raise NotImplementedError(comm._no_window_reason())
    return tensor


def resolve_tensor(tensor: torch.Tensor) -> tuple[int, int, int, int]:
    """``(ptr, count, nccl_dtype, device_id)`` of a CUDA tensor, as NCCL sees it.

    Complex tensors count as twice as many reals; ``nccl_dtype`` is the ``ncclDataType_t`` value.

    Raises:
        TypeError: ``tensor`` is not a tensor, or NCCL has no equivalent of its dtype.
        ValueError: the tensor is not on a CUDA device or not contiguous.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    return _C.resolve_tensor(tensor)


@functools.cache
def _pool_allocator() -> torch.cuda.memory.CUDAPluggableAllocator:
    return torch.cuda.memory.CUDAPluggableAllocator(
        _C.__file__, "nccl_core_pool_alloc", "nccl_core_pool_free"
    )


def mem_pool(device: torch.device | int | str | None = None) -> torch.cuda.MemPool:
    """A ``torch.cuda.MemPool`` whose memory comes from ``ncclMemAlloc``.

    Use it as ``with torch.cuda.use_mem_pool(pool, device=device):``; torch's caching allocator
    caches its blocks, so tensors allocated in it cost no ``ncclMemAlloc`` after warm-up.

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    with torch.cuda.device(_cuda_device(device)):
        return torch.cuda.MemPool(_pool_allocator().allocator())

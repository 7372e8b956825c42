"""CuPy arrays on NCCL memory (nccl4py's ``nccl.core.interop.cupy``), imported lazily.

The memory is allocated as a ``torch_nccl_core.empty`` tensor and shared with CuPy through
DLPack, so it is NCCL memory in every respect (automatic registration, windows) and is freed
when the array is garbage collected.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..memory import empty as _empty
from ..memory import resolve_tensor

__all__ = ["empty", "resolve_array"]


def _cupy() -> Any:
    try:
        import cupy
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "torch_nccl_core.interop.cupy needs CuPy; install cupy-cuda13x"
        ) from e
    return cupy


def empty(shape: int | tuple[int, ...], dtype: Any = float, order: str = "C") -> Any:
    """An uninitialized CuPy array on NCCL memory of the current CuPy device.

    Raises:
        ModuleNotFoundError: CuPy is not installed.
        ValueError: ``order`` is not ``"C"`` or ``"F"``, or a dimension is negative.
        TypeError: NCCL has no equivalent of ``dtype``.
    """
    cupy = _cupy()
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"dimensions must be >= 0, got {shape}")
    flat = _empty(
        math.prod(shape), dtype=_torch_dtype(cupy.dtype(dtype)), device=cupy.cuda.Device().id
    )
    return cupy.from_dlpack(flat).reshape(shape, order=order)


def resolve_array(array: Any) -> tuple[int, int, int, int]:
    """``(ptr, count, nccl_dtype, device_id)`` of a contiguous CuPy array.

    Raises:
        ModuleNotFoundError: CuPy is not installed.
        TypeError: ``array`` is not a CuPy array, or NCCL has no equivalent of its dtype.
        ValueError: the array is neither C- nor Fortran-contiguous.
    """
    cupy = _cupy()
    if not isinstance(array, cupy.ndarray):
        raise TypeError(f"expected a cupy.ndarray, got {type(array).__name__}")
    if array.flags.f_contiguous and not array.flags.c_contiguous:
        array = array.T  # the same dense memory, seen row-major
    return resolve_tensor(torch.from_dlpack(array))


def _torch_dtype(dtype: Any) -> torch.dtype:
    import numpy

    try:
        return torch.from_numpy(numpy.empty(0, dtype=dtype)).dtype
    except TypeError as e:
        raise TypeError(f"NCCL has no equivalent of dtype {dtype}") from e

"""The NCCL communicator of an ``nccl_core`` group and the resources it owns."""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist

from . import _C

__all__ = [
    "Communicator",
    "CustomRedOp",
    "RegisteredBuffer",
    "WaitSignalDesc",
    "Window",
    "WindowFlag",
    "backend",
    "communicator",
]

Communicator = _C.Communicator
RegisteredBuffer = _C.RegisteredBuffer
Window = _C.Window
CustomRedOp = _C.CustomRedOp
WaitSignalDesc = _C.WaitSignalDesc


class WindowFlag(enum.IntFlag):
    """Flags of ``Communicator.register_window`` (NCCL's ``NCCL_WIN_*``)."""

    DEFAULT = 0
    #: Collectives on the window may use NCCL's symmetric kernels.
    COLL_SYMMETRIC = _C.NCCL_WIN_COLL_SYMMETRIC
    #: Strict ordering of operations on the window (NCCL >= 2.29).
    STRICT_ORDERING = _C.NCCL_WIN_STRICT_ORDERING


def backend(group: dist.ProcessGroup | None = None) -> _C.NcclCoreBackend:
    """The ``nccl_core`` backend of ``group``'s CUDA ops (default: the world group).

    Raises:
        RuntimeError: the default process group is not initialized.
        ValueError: the group's CUDA backend is not ``nccl_core``.
    """
    if group is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized; call init_process_group first"
            )
        group = dist.group.WORLD
    try:
        found = group._get_backend(torch.device("cuda"))
    except RuntimeError as e:  # the group has no CUDA backend at all
        raise ValueError(f"group {group.group_name!r} has no CUDA backend: {e}") from e
    if not isinstance(found, _C.NcclCoreBackend):
        raise ValueError(
            f"group {group.group_name!r} runs {type(found).__name__} on CUDA, not nccl_core"
        )
    return found


def communicator(group: dist.ProcessGroup | None = None) -> Communicator:
    """The NCCL communicator behind ``group``'s ``nccl_core`` backend (default: the world group).

    It is created on first use (collectively, if the group was not used yet) on the group's
    device, or the current CUDA device if the group has none.

    Raises:
        RuntimeError: the default process group is not initialized.
        ValueError: the group's CUDA backend is not ``nccl_core``.
        torch.distributed.DistBackendError: the group has failed or was shut down.
    """
    return backend(group).communicator()

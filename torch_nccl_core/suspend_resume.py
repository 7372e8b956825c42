"""Releasing the memory NCCL holds for a group while it is idle (NCCL >= 2.29.7).

NCCL's ``ncclCommSuspend`` / ``ncclCommResume`` / ``ncclCommMemStats`` on the group's
communicators; torch >= 2.14 reaches the same through ``c10d.Backend.suspend`` / ``resume`` /
``memory_stats``.
"""

from __future__ import annotations

import torch.distributed as dist

from .communicator import backend

__all__ = ["memory_stats", "resume", "suspend"]


def suspend(group: dist.ProcessGroup | None = None) -> None:
    """Releases the memory NCCL can release for ``group`` (default: the world group).

    Collective: every rank of the group calls it (NCCL's suspend is a barrier of all ranks).
    Every op of the group must have finished on the GPU. The ranks agree first: where one
    cannot suspend, every rank raises and nothing is suspended. Until :func:`resume`, the
    group's ops raise ``RuntimeError`` before anything is enqueued. A second call does nothing.

    Raises:
        NotImplementedError: the loaded NCCL is older than 2.29.7.
        RuntimeError: on some rank, ops of the group are unfinished, CUDA graphs that captured
            its ops are alive, or a coalescing block is open; or NCCL refused (a communicator
            sharing resources through ``split_share``, ``NCCL_MEM_MANAGER_DISABLE=1``). The
            group stays usable.
        ValueError: the group's CUDA backend is not ``nccl_core``.
        torch.distributed.DistBackendError: the group has failed, or NCCL failed the call
            (which fails the group: the ranks could not undo a half-done suspend).
    """
    backend(group).suspend()


def resume(group: dist.ProcessGroup | None = None) -> None:
    """Restores what :func:`suspend` released; the group takes ops again. Collective, like
    :func:`suspend`; idempotent.

    Raises:
        NotImplementedError: the loaded NCCL is older than 2.29.7.
        ValueError: the group's CUDA backend is not ``nccl_core``.
        torch.distributed.DistBackendError: the group has failed, or NCCL failed the call.
    """
    backend(group).resume()


def memory_stats(group: dist.ProcessGroup | None = None) -> dict[str, int]:
    """NCCL's device memory for ``group``, in bytes, as torch's own NCCL backend reports it.

    ``suspend``: what :func:`suspend` releases; ``persist``: what it keeps; ``total``: all that
    NCCL tracks; ``suspended``: 1 while suspended, else 0. Zero before the group's first op.

    Raises:
        NotImplementedError: the loaded NCCL is older than 2.29.7.
        ValueError: the group's CUDA backend is not ``nccl_core``.
        torch.distributed.DistBackendError: the group has failed, or NCCL failed the call.
    """
    return dict(backend(group).memory_stats())

"""Registration of ordinary PyTorch memory with a group's NCCL communicator.

``Options(register_caching_allocator=True)`` (or ``TORCH_NCCL_CORE_REGISTER_ALLOCATOR=1``) makes
ops on ordinary tensors register the caching-allocator segment they lie in, on first use; this
module registers a whole ``torch.cuda.MemPool`` at once, as torch's own NCCL backend does, and
reports what a group holds registered.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .communicator import backend

__all__ = ["deregister_mem_pool", "register_mem_pool", "registration_stats"]


def _pool_id(pool: torch.cuda.MemPool) -> tuple[int, int]:
    if not isinstance(pool, torch.cuda.MemPool):
        raise TypeError(f"expected a torch.cuda.MemPool, got {type(pool).__name__}")
    return tuple(pool.id)


def register_mem_pool(pool: torch.cuda.MemPool, group: dist.ProcessGroup | None = None) -> None:
    """Registers the segments ``pool`` holds now with ``group``'s communicator (default: world).

    Segments the pool gets later are registered by the ops that use them, where the group has
    ``register_caching_allocator`` on. torch's free of a segment (``torch.cuda.empty_cache()``,
    the pool's end) drops its registration first.

    Raises:
        TypeError: ``pool`` is not a ``torch.cuda.MemPool``.
        ValueError: ``pool`` is registered with the group already, or holds memory of another
            device than the group's; the group's CUDA backend is not ``nccl_core``.
    """
    backend(group).register_mem_pool(_pool_id(pool))


def deregister_mem_pool(pool: torch.cuda.MemPool, group: dist.ProcessGroup | None = None) -> None:
    """Drops what :func:`register_mem_pool` registered of ``pool`` (its freed segments' are gone).

    Raises:
        TypeError: ``pool`` is not a ``torch.cuda.MemPool``.
        ValueError: ``pool`` is not registered with the group.
    """
    backend(group).deregister_mem_pool(_pool_id(pool))


def registration_stats(group: dist.ProcessGroup | None = None) -> dict[str, int | float]:
    """What ``group`` holds registered with NCCL, and what registering on first use cost.

    ``registrations`` and ``bytes``: live registrations on the group's communicator (and its
    window-free twin); ``first_uses`` and ``first_use_seconds``: the registrations ops asked
    NCCL for on first use since the group began (those NCCL refused included), and their time
    all together; ``upgraded_windows`` and ``upgraded_window_bytes``: the symmetric windows
    ``Options(window_upgrade=True)`` registered since the group began (those closed since
    included), and their bytes.
    """
    return dict(backend(group).registration_stats())

"""The one-sided torch ops (``torch.ops.nccl_core.*``) with process-group arguments.

The ops take the group by name, like torch's ``_c10d_functional`` ops, so they work eagerly,
inside CUDA graphs and under ``torch.compile(fullgraph=True)``. ``window`` is the window's memory
(``torch_nccl_core.empty(..., window=True)``); the ops mark it as mutated, which orders them after
the code that fills it and before the code that reads it.

Eagerly, each op is numbered and watched like a synchronous collective of the group: a wait whose
signals never come fails the group at its timeout, and every later op raises
``torch.distributed.DistBackendError`` naming that wait, its peer and the group. Arguments are
checked before NCCL is called (``ValueError``); a put must fit the *target* rank's window, which
may be smaller than this rank's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (registers the op library)

__all__ = ["put_signal", "signal", "wait_signal"]


def _name(group: dist.ProcessGroup | None) -> str:
    return (group if group is not None else dist.group.WORLD).group_name


def put_signal(
    src: torch.Tensor,
    window: torch.Tensor,
    peer: int,
    offset: int = 0,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Copy ``src`` into ``peer``'s part of ``window`` at ``offset`` elements; signal ``peer``."""
    torch.ops.nccl_core.put_signal(src, window, peer, offset, _name(group))


def signal(window: torch.Tensor, peer: int, group: dist.ProcessGroup | None = None) -> None:
    """Raise one signal at ``peer``."""
    torch.ops.nccl_core.signal(window, peer, _name(group))


def wait_signal(
    window: torch.Tensor,
    peers: int | Sequence[int],
    op_counts: int | Sequence[int] = 1,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Wait (on the current stream) for ``op_counts`` signals from each of ``peers``."""
    peers = [peers] if isinstance(peers, int) else list(peers)
    counts = [op_counts] * len(peers) if isinstance(op_counts, int) else list(op_counts)
    torch.ops.nccl_core.wait_signal(window, peers, counts, _name(group))

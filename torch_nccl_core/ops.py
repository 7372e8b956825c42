"""The one-sided torch ops (``torch.ops.nccl_core.*``) with process-group arguments.

The ops take the group by name, like torch's ``_c10d_functional`` ops, so they work eagerly,
inside CUDA graphs and under ``torch.compile`` with any backend (``fullgraph=True`` and
``mode="reduce-overhead"`` included). ``window`` is the window's memory
(``torch_nccl_core.empty(..., window=True)``), only read by the ops; ``wait_signal`` returns what
the window holds once the signals came (a copy), so code that reads what arrived is ordered after
the wait by its data. Compiled graphs keep the ops in program order (they are registered as
effectful). Under ``mode="reduce-overhead"`` mark the window with
``torch._dynamo.mark_static_address``: CUDA graphs would otherwise run on a copy of it.

Eagerly, each op is numbered and watched like a synchronous collective of the group: a wait whose
signals never come fails the group at its timeout, and every later op raises
``torch.distributed.DistBackendError`` naming that wait, its peer and the group. Arguments are
checked before NCCL is called (``ValueError``); a put must fit the *target* rank's window, which
may be smaller than this rank's.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (registers the op library)

__all__ = ["put_signal", "signal", "wait_signal"]


def _keep_in_order() -> None:
    """Registers the ops as effectful: torch.compile threads an effect token through them, so it
    neither drops nor reorders them (their only outputs are on other ranks, or a copy). A private
    torch API: where a torch release lacks it, the package still imports, and says what is lost."""
    try:
        from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

        for name in ("put_signal", "signal", "wait_signal"):
            op = getattr(torch.ops.nccl_core, name).default
            _register_effectful_op(op, _EffectType.ORDERED)
    except (ImportError, AttributeError, TypeError) as e:
        warnings.warn(
            f"torch_nccl_core: torch.ops.nccl_core's one-sided ops could not be registered as "
            f"effectful ({e}); torch.compile may drop or reorder them",
            stacklevel=2,
        )


_keep_in_order()


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
) -> torch.Tensor:
    """Wait (on the current stream) for ``op_counts`` signals from each of ``peers``; returns a
    copy of ``window`` made after them (pass the part of the window to read). Under
    ``torch.compile`` read what arrived from it: the compiler cannot see peers write the window."""
    peers = [peers] if isinstance(peers, int) else list(peers)
    counts = [op_counts] * len(peers) if isinstance(op_counts, int) else list(op_counts)
    return torch.ops.nccl_core.wait_signal(window, peers, counts, _name(group))

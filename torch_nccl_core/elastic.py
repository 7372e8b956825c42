"""Growing the world back: new processes join the default group (NCCL >= 2.29's ncclCommGrow).

After a rank died and the others shrank the world (``torch.distributed.shrink_group``), a
replacement process joins it, and the world grows back::

    # every rank of the world                 # the replacement process
    world = grow_group(4, key="regrow-1")     world = join_group(4, 3, key="regrow-1")

Ranks of the world keep their numbers; joining processes take the others. Both calls return the
grown world, which becomes the process's default group, as ``shrink_group`` makes the shrunk world
the default: every other group of a rank of the old world is destroyed with it. The grown world
keeps the old one's options and timeout; a joining process passes the same ``pg_options`` as the
world's ranks did. The processes first meet in the job's store (the one under the old world, the
one at ``MASTER_ADDR:MASTER_PORT`` for a joining process), bounded by the world's timeout; a
process that never came is named in the ``DistBackendError`` of those that did. NCCL's grow
itself is bounded by that timeout on a nonblocking group (``Options(blocking=False)``); on a
blocking one (the default) a process that dies after the meeting leaves the others waiting in
NCCL, as its initialization does (docs/design.md, Known limits).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import _C
from ._registration import BACKEND_NAME
from .communicator import backend

__all__ = ["grow_group", "join_group"]

_logger = logging.getLogger(__name__)


def grow_group(size: int, key: str) -> dist.ProcessGroup:
    """Grows the default group to ``size`` ranks with processes that call :func:`join_group`
    with the same ``key``; returns the grown group, now the default one.

    Collective over the default group. ``key`` names this grow in the job's store: each grow of
    a job needs its own.

    Raises:
        NotImplementedError: the loaded NCCL is older than 2.29 (no ``ncclCommGrow``).
        ValueError: ``size`` is not larger than the group, ``key`` is empty or was used by an
            earlier grow, or the default group's CUDA backend is not ``nccl_core``.
        torch.distributed.DistBackendError: a process did not join within the group's timeout
            (named), or NCCL failed the grow.
    """
    _check_key(key)
    world = dist.group.WORLD
    impl = backend(world)
    root = _root_store(c10d._world.pg_map[world][1])
    name = _group_name(key)
    store = dist.PrefixStore(f"{name}/", root)
    grown = impl._grow(store, size, name)
    rank, device = world.rank(), getattr(world, "bound_device_id", None)
    # The grown world replaces the old one: every group of it goes now, as shrink_group does.
    try:
        dist.destroy_process_group()
    except Exception:  # as shrink_group: the grown world is what counts now
        _logger.warning("destroying the world that grew into %s failed", name, exc_info=True)
    return _as_world(grown, store, name, rank, size, device)


def join_group(
    size: int,
    rank: int,
    key: str,
    *,
    store: dist.Store | None = None,
    timeout: timedelta = timedelta(minutes=10),
    pg_options: _C.Options | None = None,
    device_id: torch.device | int | None = None,
) -> dist.ProcessGroup:
    """Joins, as rank ``rank`` of ``size``, the grow of a world that calls :func:`grow_group`
    with ``key``; returns the grown group, this process's default group from now on.

    ``store``: the job's store (default: a client of the TCPStore at ``MASTER_ADDR`` /
    ``MASTER_PORT``). ``timeout``: how long to wait for the world to start growing; the grown
    group then takes the world's timeout. ``device_id``: this process's GPU (default: the
    current one), to which the grown group is bound.

    Raises:
        NotImplementedError: the loaded NCCL is older than 2.29.
        ValueError: ``rank`` is a rank of the growing world or was taken by another joining
            process, ``size`` is not the size it grows to, ``key`` is empty, or this process has
            a default group already.
        torch.distributed.DistBackendError: no world grew under ``key``, or a process did not
            come, within ``timeout``; or NCCL failed the grow.
    """
    _check_key(key)
    if dist.is_initialized():
        raise ValueError(
            "join_group makes the grown group this process's default group, but it has one "
            "already: call it in a process that has not called init_process_group"
        )
    if pg_options is not None and not isinstance(pg_options, _C.Options):
        raise TypeError(
            f"pg_options must be torch_nccl_core.Options, got {type(pg_options).__name__}"
        )
    root = store if store is not None else _job_store(timeout)
    device = torch.device("cuda", device_id) if isinstance(device_id, int) else device_id
    if device is None or device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    name = _group_name(key)
    group_store = dist.PrefixStore(f"{name}/", _root_store(root))
    grown = _C.NcclCoreBackend._join(
        group_store,
        rank,
        size,
        name,
        pg_options if pg_options is not None else _C.Options(),
        timeout,
        device.index,
    )
    return _as_world(grown, group_store, name, rank, size, device)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string naming the grow, got {key!r}")


def _group_name(key: str) -> str:
    return f"nccl_core_grow:{key}"


def _root_store(store: dist.Store) -> dist.Store:
    """The store under every PrefixStore of ``store``: the one all processes of the job reach."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _job_store(timeout: timedelta) -> dist.Store:
    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except KeyError as e:
        raise ValueError(
            f"join_group needs the job's store: pass store=, or set {e.args[0]}"
        ) from None
    return dist.TCPStore(host, port, is_master=False, timeout=timeout)


def _as_world(
    grown: _C.NcclCoreBackend,
    store: dist.Store,
    name: str,
    rank: int,
    size: int,
    device: torch.device | None,
) -> dist.ProcessGroup:
    """``grown`` as a ProcessGroup registered with torch as the default group, bound to
    ``device`` where given (as ``shrink_group`` registers the shrunk world)."""
    kind = dist.ProcessGroup.BackendType.CUSTOM
    group = dist.ProcessGroup(store, rank, size)
    group._register_backend(torch.device("cuda"), kind, grown)
    group._set_default_backend(kind)
    if device is not None:
        group.bound_device_id = device
    group._set_group_name(name)
    group._set_group_desc("default_pg")
    c10d._update_default_pg(group)
    world = c10d._world
    world.pg_map[group] = (BACKEND_NAME, store)
    world.pg_names[group] = name
    world.pg_backend_config[group] = f"cuda:{BACKEND_NAME}"
    world.pg_group_ranks[group] = {r: r for r in range(size)}
    tag = f"ptd:{name}"
    world.tags_to_pg.setdefault(tag, []).append(group)
    world.tags_to_pg.setdefault("", []).append(group)
    world.pg_to_tag[group] = tag
    c10d._register_process_group(name, group)
    return group

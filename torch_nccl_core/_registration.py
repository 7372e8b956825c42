"""Registration of the ``nccl_core`` backend with torch.distributed."""

import torch.distributed as dist

from . import _C

BACKEND_NAME = "nccl_core"


def _create_backend(dist_options, backend_options):
    """Creator called by torch.distributed for each group (extended API)."""
    if backend_options is not None and not isinstance(backend_options, _C.Options):
        raise TypeError(
            f"pg_options of an {BACKEND_NAME} group must be torch_nccl_core.Options, "
            f"got {type(backend_options).__name__}"
        )
    return _C.NcclCoreBackend(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.group_id,
        backend_options if backend_options is not None else _C.Options(),
        dist_options.timeout,
        list(dist_options.global_ranks_in_group),
    )


def register() -> None:
    """Register ``nccl_core`` for CUDA tensors; safe to call more than once."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cuda"]
    )

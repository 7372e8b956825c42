"""torch-nccl-core: the ``nccl_core`` torch.distributed backend.

Importing this package registers the backend::

    import torch_nccl_core  # noqa: F401
    torch.distributed.init_process_group("nccl_core", device_id=device)
"""

import torch
import torch.distributed  # noqa: F401  (the C++ backend derives from its classes)

from . import _C, interop, ops
from ._registration import BACKEND_NAME, register
from ._version import __version__
from .buffer_registration import deregister_mem_pool, register_mem_pool, registration_stats
from .communicator import (
    Communicator,
    CustomRedOp,
    RegisteredBuffer,
    WaitSignalDesc,
    Window,
    WindowFlag,
    communicator,
)
from .dev_comm import DevCommRequirements, GinConnectionType, GinType
from .elastic import grow_group, join_group
from .memory import empty, mem_pool, resolve_tensor
from .suspend_resume import memory_stats, resume, suspend

Options = _C.Options


def nccl_version() -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the NCCL library loaded at run time."""
    return tuple(_C.nccl_version())


def features() -> dict[str, bool]:
    """What the loaded NCCL supports, by feature name (e.g. ``"float8"``)."""
    return dict(_C.features())


def one_sided_engine() -> str:
    """The engine of one-sided operations in this process, chosen once.

    ``"nccl"``: NCCL >= 2.29's host API; ``"load_store"``: this package's own, for peers reachable
    by load/store. ``TORCH_NCCL_CORE_ONE_SIDED_ENGINE`` (``auto``, ``nccl``, ``load_store``)
    chooses; ``auto`` takes ``nccl`` where the loaded NCCL has it.
    """
    return _C.one_sided_engine()


def dump_flight_recorder(only_active: bool = False) -> bytes:
    """The last ops of this process's ``nccl_core`` groups, in torch's flight recorder format.

    The pickled dict torch's analyzer reads (``python -m torch.distributed.flight_recorder.fr_trace
    <dir>``, one file per rank). Kept for the last ``TORCH_FR_BUFFER_SIZE`` ops (2000 by default)
    of torch versions before 2.15; from 2.15 torch records ``nccl_core`` groups itself
    (``torch._C._distributed_c10d._dump_fr_trace``) and this dump is empty. With
    ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` a group that times out or fails writes it to
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`` as well.
    """
    return _C.dump_flight_recorder(only_active)


register()

__all__ = [
    "BACKEND_NAME",
    "Communicator",
    "CustomRedOp",
    "DevCommRequirements",
    "GinConnectionType",
    "GinType",
    "Options",
    "RegisteredBuffer",
    "WaitSignalDesc",
    "Window",
    "WindowFlag",
    "__version__",
    "communicator",
    "deregister_mem_pool",
    "dump_flight_recorder",
    "empty",
    "features",
    "grow_group",
    "interop",
    "join_group",
    "mem_pool",
    "memory_stats",
    "nccl_version",
    "one_sided_engine",
    "ops",
    "register_mem_pool",
    "registration_stats",
    "resolve_tensor",
    "resume",
    "suspend",
]

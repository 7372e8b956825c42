"""Type stubs of the torch_nccl_core._C extension."""

from datetime import timedelta

import torch
from torch._C._distributed_c10d import Backend, Store

class Options:
    """Options of an nccl_core process group (``pg_options``).

    Raises:
        ValueError: a value is out of range (``min_ctas``/``max_ctas`` in [1, 64] with
            ``min_ctas <= max_ctas``, ``cga_cluster_size`` in [0, 8], positive ``timeout``).
        NotImplementedError: ``blocking=False`` (nonblocking communicators).
    """

    timeout: timedelta | None
    high_priority_stream: bool
    blocking: bool | None
    cga_cluster_size: int | None
    min_ctas: int | None
    max_ctas: int | None
    net_name: str | None
    split_share: bool | None
    comm_name: str | None
    def __init__(
        self,
        *,
        timeout: timedelta | None = None,
        high_priority_stream: bool = False,
        blocking: bool | None = None,
        cga_cluster_size: int | None = None,
        min_ctas: int | None = None,
        max_ctas: int | None = None,
        net_name: str | None = None,
        split_share: bool | None = None,
        comm_name: str | None = None,
    ) -> None: ...

class GroupOptions(Backend.Options):
    def __copy__(self) -> GroupOptions: ...
    def __deepcopy__(self, memo: dict) -> GroupOptions: ...

class NcclCoreBackend(Backend):
    def __init__(
        self,
        store: Store,
        rank: int,
        size: int,
        group_name: str,
        options: Options,
        default_timeout: timedelta,
    ) -> None: ...
    @property
    def nccl_options(self) -> Options: ...
    @property
    def options(self) -> GroupOptions: ...
    def perform_nocolor_split(self, device) -> None: ...

def empty(
    sizes: list[int], dtype: torch.dtype, device: int, column_major: bool
) -> torch.Tensor: ...
def resolve_tensor(tensor: torch.Tensor) -> tuple[int, int, int, int]: ...
def nccl_version() -> tuple[int, int, int]: ...
def nccl_header_version() -> int: ...
def features() -> dict[str, bool]: ...

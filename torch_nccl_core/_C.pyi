"""Type stubs of the torch_nccl_core._C extension."""

from collections.abc import Sequence
from datetime import timedelta

import torch
from torch._C._distributed_c10d import Backend, ReduceOp, Store

class Options:
    """Options of an nccl_core process group (``pg_options``).

    ``copy_engine_reduce_scatter``: ``reduce_scatter_tensor`` through the copy engine where
    every peer is load/store reachable; ``None`` from 32 MiB of output, ``True`` at every
    size, ``False`` never.

    Raises:
        ValueError: a value is out of range (``min_ctas``/``max_ctas`` in [1, 64] with
            ``min_ctas <= max_ctas``, ``cga_cluster_size`` in [0, 8], positive ``timeout``).
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
    copy_engine_reduce_scatter: bool | None
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
        copy_engine_reduce_scatter: bool | None = None,
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
        global_ranks: list[int] = ...,
    ) -> None: ...
    @property
    def nccl_options(self) -> Options: ...
    @property
    def options(self) -> GroupOptions: ...
    def perform_nocolor_split(self, device) -> None: ...
    def communicator(self, device: torch.device | None = None) -> Communicator: ...

class CommResource:
    """Base of the resources a communicator owns."""

    @property
    def is_valid(self) -> bool: ...
    def close(self) -> None: ...

class RegisteredBuffer(CommResource):
    @property
    def handle(self) -> int: ...
    @property
    def size(self) -> int: ...

class Window(CommResource):
    @property
    def handle(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def user_ptr(self) -> int: ...
    def lsa_pointer(self, lsa_rank: int, offset: int = 0) -> int: ...
    def peer_pointer(self, peer: int, offset: int = 0) -> int | None: ...
    def multimem_pointer(self, offset: int = 0) -> int | None: ...
    def __enter__(self) -> Window: ...
    def __exit__(self, *args: object) -> None: ...

class CustomRedOp(CommResource):
    @property
    def op(self) -> int: ...
    @property
    def reduce_op(self) -> ReduceOp: ...

class Communicator:
    """The NCCL communicator of an nccl_core group.

    Raises (methods): ValueError / TypeError for bad tensors, flags or dtypes;
    NotImplementedError for features the loaded NCCL lacks (naming the version needed);
    torch.distributed.DistBackendError for NCCL failures; RuntimeError for closed resources.
    """

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def lsa_rank(self) -> int: ...
    @property
    def lsa_size(self) -> int: ...
    @property
    def is_aborted(self) -> bool: ...
    def register_buffer(self, tensor: torch.Tensor) -> RegisteredBuffer: ...
    def register_window(self, tensor: torch.Tensor, flags: int = 0) -> Window | None: ...
    def find_window(self, tensor: torch.Tensor) -> Window | None: ...
    def create_pre_mul_sum(self, scalar: float, dtype: torch.dtype) -> CustomRedOp: ...
    def put_signal(
        self,
        src: torch.Tensor,
        peer: int,
        window: Window,
        offset: int = 0,
        signal_index: int = 0,
        context: int = 0,
        flags: int = 0,
        *,
        stream: object = None,
    ) -> None: ...
    def signal(
        self,
        peer: int,
        signal_index: int = 0,
        context: int = 0,
        flags: int = 0,
        *,
        stream: object = None,
    ) -> None: ...
    def wait_signal(
        self, descs: WaitSignalDesc | Sequence[WaitSignalDesc], *, stream: object = None
    ) -> None: ...
    def create_dev_comm(self, requirements: object = None) -> DevComm: ...
    @property
    def gin_type(self) -> object: ...
    @property
    def railed_gin_type(self) -> object: ...

class WaitSignalDesc:
    def __init__(
        self, peer: int, op_count: int = 1, signal_index: int = 0, context: int = 0
    ) -> None: ...
    @property
    def peer(self) -> int: ...
    @property
    def op_count(self) -> int: ...
    @property
    def signal_index(self) -> int: ...
    @property
    def context(self) -> int: ...

class DevComm(CommResource):
    @property
    def ptr(self) -> int: ...
    @property
    def lsa_rank(self) -> int: ...
    @property
    def lsa_size(self) -> int: ...

def empty(
    sizes: list[int], dtype: torch.dtype, device: int, column_major: bool
) -> torch.Tensor: ...
def resolve_tensor(tensor: torch.Tensor) -> tuple[int, int, int, int]: ...
def nccl_version() -> tuple[int, int, int]: ...
def nccl_header_version() -> int: ...
def features() -> dict[str, bool]: ...
def dump_flight_recorder(only_active: bool = False) -> bytes: ...
def flight_recorder_enabled() -> bool: ...
def one_sided_engine() -> str: ...

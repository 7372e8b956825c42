"""Device communicators (nccl4py's ``Communicator.create_dev_comm``): requirements and GIN enums.

``torch_nccl_core.communicator(group).create_dev_comm(DevCommRequirements(...))`` returns a
``DevComm`` whose ``ptr`` is the host address of an ``ncclDevComm_t`` to pass to a kernel.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["DevCommRequirements", "GinConnectionType", "GinType"]


class GinType(enum.IntEnum):
    """ncclGinType_t: the device-side network transport of a communicator."""

    NONE = 0
    PROXY = 2
    GDAKI = 3
    GPI = 4


class GinConnectionType(enum.IntEnum):
    """ncclGinConnectionType_t: which peers must be reachable through GIN."""

    NONE = 0
    FULL = 1
    RAIL = 2


@dataclasses.dataclass
class DevCommRequirements:
    """Fields of ncclDevCommRequirements; ``None`` keeps NCCL's default.

    A field set to a value that the NCCL this extension was built against lacks raises
    ``NotImplementedError`` from ``create_dev_comm``.
    """

    lsa_multimem: bool | None = None
    barrier_count: int | None = None
    lsa_barrier_count: int | None = None
    rail_gin_barrier_count: int | None = None
    lsa_ll_a2a_block_count: int | None = None
    lsa_ll_a2a_slot_count: int | None = None
    gin_force_enable: bool | None = None
    gin_context_count: int | None = None
    gin_signal_count: int | None = None
    gin_counter_count: int | None = None
    gin_connection_type: GinConnectionType | None = None
    gin_exclusive_contexts: bool | None = None
    gin_queue_depth: int | None = None
    gin_traffic_class: int | None = None
    world_gin_barrier_count: int | None = None
    gin_strong_signals_required: bool | None = None
    gin_va_signals_required: bool | None = None

    def _nccl_fields(self) -> dict[str, int]:
        fields = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if not isinstance(value, (bool, int)):
                raise TypeError(f"DevCommRequirements.{field.name} must be an int or bool")
            if not isinstance(value, bool) and value < 0:
                raise ValueError(f"DevCommRequirements.{field.name} must be >= 0, got {value}")
            if field.name == "gin_connection_type":
                value = GinConnectionType(value)  # ValueError names the bad value
            fields[field.name] = int(value)
        return fields

"""A rank's first step under ``torch_nccl_core.launch``: ``python _as_rank.py [-m] PROGRAM ARGS``.

Where the node's ranks share GPUs (the launcher then sets ``TORCH_NCCL_CORE_HOST_ID_PREFIX``), the
rank takes a host id of its own (``NCCL_HOSTID``) before NCCL starts, then becomes its program.
Runs by path and imports nothing heavy: it costs one interpreter start per rank.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

HOST_ID_PREFIX_VAR = "TORCH_NCCL_CORE_HOST_ID_PREFIX"


def host_id(prefix: str, local_rank: int) -> str:
    """The NCCL host id of one rank of a node whose ranks share GPUs."""
    return f"{prefix}-r{local_rank}"


def become_rank(program: Sequence[str]) -> None:
    prefix = os.environ.get(HOST_ID_PREFIX_VAR)
    if prefix:
        os.environ["NCCL_HOSTID"] = host_id(prefix, int(os.environ["LOCAL_RANK"]))
    os.execv(sys.executable, [sys.executable, "-u", *program])  # unbuffered, as torchrun runs


if __name__ == "__main__":
    become_rank(sys.argv[1:])

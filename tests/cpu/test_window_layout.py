"""Every rank's part of a window, checked before NCCL registers it (csrc/nccl/window_layout.h),
against the scripted NCCL: NCCL addresses a peer's part at this rank's own offset in its
allocation, and before 2.30.7 maps it with this rank's allocation size, so such layouts are
refused before NCCL is asked; a window keeps every rank's part, which puts are bounded by."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import torch

import torch_nccl_core

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


pytestmark = pytest.mark.skipif(
    torch_nccl_core.one_sided_engine() != "nccl",
    reason="fake windows stay off the load/store engine only with NCCL >= 2.29's host API",
)

NBYTES = 1 << 16
MiB = 1 << 20


@pytest.fixture
def comm(fake):
    """A fake communicator of rank 0 of 2, and a tensor of NCCL memory."""
    comm = testing.create_communicator(2, 0, timedelta(seconds=5), False, "group 'g'")
    yield comm
    testing.abort(comm)


@pytest.fixture
def memory():
    tensor = torch.empty(NBYTES // 4)
    testing.record_allocation(tensor)
    yield tensor
    testing.forget_allocation(tensor)


def test_parts_at_different_offsets_are_refused_before_nccl(fake, comm, memory):
    parts = [(2 * MiB, 0), (2 * MiB, 4096)]
    with pytest.raises(ValueError, match=r"rank 1's part starts 4096 bytes into .* rank 0's 0"):
        testing.register_window(comm, memory, 0, parts=parts)
    assert fake.calls("ncclCommWindowRegister") == 0 and comm._resource_count() == 0
    window = testing.register_window(comm, memory, 0)  # the group stays usable
    assert window is not None and fake.calls("ncclCommWindowRegister") == 1


def test_allocations_of_different_sizes_by_nccl_version(fake, comm, memory):
    """Accepted where NCCL maps each rank's own size (2.30.7), refused before."""
    parts = [(2 * MiB, 0), (6 * MiB, 0)]
    if torch_nccl_core.features()["window_sizes_per_rank"]:
        assert testing.register_window(comm, memory, 0, parts=parts) is not None
        return
    with pytest.raises(ValueError, match=r"rank 1's part lies in an NCCL allocation of 6291456"):
        testing.register_window(comm, memory, 0, parts=parts)
    assert fake.calls("ncclCommWindowRegister") == 0


def test_same_offsets_inside_allocations_are_accepted(fake, comm, memory):
    window = testing.register_window(comm, memory, 0, parts=[(4 * MiB, 2 * MiB)] * 2)
    assert window is not None and window.size == NBYTES


MINE = (2 * MiB, 0, NBYTES, 0, False)  # allocation bytes, offset, bytes, flags, refused


@pytest.mark.parametrize(
    ("other", "own_sizes", "match"),
    [
        ((2 * MiB, 0, NBYTES // 2, 0, False), False, None),  # a part of another size
        ((2 * MiB, 4096, NBYTES, 0, False), True, r"rank 1's part starts 4096 bytes into"),
        ((2 * MiB, 0, NBYTES, 1, False), True, r"rank 1 asked for window flags 1 and rank 0"),
        ((6 * MiB, 0, NBYTES, 0, False), False, r"rank 1's part lies in an NCCL allocation"),
        ((6 * MiB, 0, NBYTES, 0, False), True, None),  # NCCL >= 2.30.7 maps each rank's size
        ((0, 0, 0, 0, True), True, r"rank 1 refused its part of the window"),
    ],
    ids=["sizes", "offsets", "flags", "allocations_old", "allocations_new", "refused"],
)
def test_layout_rules(other, own_sizes, match):
    """Each rule on its own, whatever NCCL this process loaded; the first rank that differs from
    rank 0 is named."""
    conflict = testing.window_layout_conflict([MINE, other, MINE], own_sizes)
    if match is None:
        assert conflict is None
    else:
        assert conflict is not None and re.search(match, conflict), conflict

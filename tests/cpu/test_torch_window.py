"""torch's window API (torch >= 2.14) on an nccl_core backend, up to the first CUDA call.

What a window refuses before it holds a tensor, and a tensor it cannot register, are decided
without a GPU; the one-sided traffic itself is tested in tests/gpu/test_torch_window.py.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core
from torch_nccl_core import _C

pytestmark = pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d, "Window"),
    reason="torch's window API needs torch >= 2.14",
)


@pytest.fixture
def backend(tmp_path):
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    backend = _C.NcclCoreBackend(
        store, 0, 1, "g", torch_nccl_core.Options(), datetime.timedelta(seconds=5)
    )
    yield backend
    backend.shutdown()


def _supports_window(backend) -> bool:
    value = backend.supports_window  # a method in torch 2.14, a property later
    return value() if callable(value) else value


def test_backend_offers_windows(backend):
    assert _supports_window(backend) is True
    assert isinstance(backend.new_window(), torch._C._distributed_c10d.Window)


@pytest.mark.parametrize(
    "call",
    [
        lambda w: w.put(torch.ones(2), 0, 0, False),
        lambda w: w.signal(0, False),
        lambda w: w.wait_signal(0, True),
        lambda w: w.map_remote_tensor(0),
        lambda w: w.get_attr(0),
        lambda w: w.tensor_deregister(),
    ],
    ids=["put", "signal", "wait_signal", "map_remote_tensor", "get_attr", "tensor_deregister"],
)
def test_a_window_without_a_tensor_says_to_register_one(backend, call):
    window = backend.new_window()
    with pytest.raises(RuntimeError, match="holds no tensor; call tensor_register first"):
        call(window)


def test_a_host_tensor_is_refused_and_leaves_the_window_usable(backend):
    window = backend.new_window()
    with pytest.raises(ValueError, match="tensor_register: tensor must be a CUDA tensor"):
        window.tensor_register(torch.ones(4))
    with pytest.raises(ValueError, match="tensor_register: tensor must be a CUDA tensor"):
        backend.new_window(torch.ones(4))
    # Nothing was registered: the window still asks for a tensor.
    with pytest.raises(RuntimeError, match="holds no tensor"):
        window.signal(0, False)

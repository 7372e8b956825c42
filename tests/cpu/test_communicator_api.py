"""Argument checks of the communicator and window APIs that need no GPU."""

from __future__ import annotations

import sys

import pytest
import torch

import torch_nccl_core
from torch_nccl_core import WindowFlag


def test_window_flags_match_nccl():
    assert (WindowFlag.DEFAULT, WindowFlag.COLL_SYMMETRIC, WindowFlag.STRICT_ORDERING) == (0, 1, 2)
    assert WindowFlag.COLL_SYMMETRIC | WindowFlag.STRICT_ORDERING == 3


def test_communicator_needs_an_initialized_group():
    with pytest.raises(RuntimeError, match="not initialized"):
        torch_nccl_core.communicator()


def test_group_only_with_window():
    with pytest.raises(ValueError, match="window=True"):
        torch_nccl_core.empty(4, group=object())


def test_features_report_window_and_nonblocking_support():
    features = torch_nccl_core.features()
    assert features["nonblocking_init"] is True
    major, minor, _ = torch_nccl_core.nccl_version()
    assert features["window_host_pointers"] == ((major, minor) >= (2, 29))
    assert features["window_strict_ordering"] == ((major, minor) >= (2, 29))


def test_cupy_interop_names_cupy_when_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes "import cupy" fail
    with pytest.raises(ModuleNotFoundError, match="CuPy"):
        torch_nccl_core.interop.cupy.empty(4)
    with pytest.raises(ModuleNotFoundError, match="CuPy"):
        torch_nccl_core.interop.cupy.resolve_array(torch.ones(2))


def test_interop_has_no_other_modules():
    with pytest.raises(AttributeError, match="jax"):
        torch_nccl_core.interop.jax  # noqa: B018

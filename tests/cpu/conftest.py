"""Fixtures of the CPU tests that run the package's logic against a scripted NCCL."""

from __future__ import annotations

import gc
import sys

import pytest

try:
    from torch_nccl_core import _testing
except ImportError:  # built without TORCH_NCCL_CORE_TESTING=1
    _testing = None

# Fakes left installed because communicators of theirs outlived a failed test.
_KEPT: list = []


@pytest.fixture
def fake(request):
    """`_testing.FakeNccl` installed for the test (csrc/testing/fake_nccl.h); fails the test if
    a communicator of it outlives the test or was misused. Indirect parametrization with
    {"revoke": False} gives a table without ncclCommRevoke (NCCL < 2.28.7)."""
    if _testing is None:
        pytest.skip("the test doubles are built with TORCH_NCCL_CORE_TESTING=1")
    fake = _testing.FakeNccl(**getattr(request, "param", {}))
    yield fake
    # A raised error's traceback keeps the test's frame, and so its
    # communicators, alive: in a cycle, or in sys.last_* after a failure.
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    gc.collect()
    if fake.live != 0:
        # Freeing them later under real NCCL would crash: keep the fake.
        _KEPT.append(fake)
        pytest.fail(f"{fake.live} communicators of the fake outlived the test")
    fake.uninstall()
    assert fake.aborted_under_call == 0
    assert fake.used_after_free == 0

"""TORCH_NCCL_CORE_ONE_SIDED_ENGINE: which engine each choice gets on the loaded NCCL.

The engine is chosen once per process, so each case runs in a fresh interpreter. Choosing needs
NCCL's library, not a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import torch_nccl_core

HAS_HOST_API = torch_nccl_core.nccl_version() >= (2, 29, 0)


def _engine(choice: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCH_NCCL_CORE_ONE_SIDED_ENGINE=choice)
    code = "import torch_nccl_core; print(torch_nccl_core.one_sided_engine())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "nccl" if HAS_HOST_API else "load_store"),
        ("load_store", "load_store"),
    ],
)
def test_engine_choice(choice, expected):
    result = _engine(choice)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_forcing_nccl_engine_without_its_api_names_nccl_2_29():
    result = _engine("nccl")
    if HAS_HOST_API:
        assert result.stdout.strip() == "nccl"
    else:
        assert "NotImplementedError" in result.stderr
        assert "NCCL >= 2.29" in result.stderr


def test_unknown_engine_is_refused():
    result = _engine("fast")
    assert result.returncode != 0
    assert "ValueError" in result.stderr
    assert "auto, nccl or load_store" in result.stderr

"""Build the example kernel against the NCCL headers torch_nccl_core was built with."""

from __future__ import annotations

import pathlib

import nvidia.nccl
from torch.utils.cpp_extension import load

HERE = pathlib.Path(__file__).resolve().parent


def build():
    """The compiled extension module (cached by torch between runs)."""
    nccl = pathlib.Path(next(iter(nvidia.nccl.__path__)))
    return load(
        name="nccl_core_device_kernel_example",
        sources=[str(HERE / "exchange.cu")],
        extra_include_paths=[str(nccl / "include")],
        extra_cuda_cflags=["-O2"],
        verbose=False,
    )

"""Build the example kernel against the NCCL headers torch_nccl_core was built with.

The device API's structures (ncclDevComm, windows) are laid out per NCCL release, so the kernel
must be compiled with the headers of the NCCL loaded at run time, as the extension was. Headers
are found as setup.py finds them: NCCL_INCLUDE_DIR, NCCL_HOME/include, or the nvidia-nccl package.
"""

from __future__ import annotations

import os
import pathlib
import re

from torch.utils.cpp_extension import load

import torch_nccl_core

HERE = pathlib.Path(__file__).resolve().parent


def nccl_include_dir() -> pathlib.Path:
    if os.environ.get("NCCL_INCLUDE_DIR"):
        return pathlib.Path(os.environ["NCCL_INCLUDE_DIR"])
    if os.environ.get("NCCL_HOME"):
        return pathlib.Path(os.environ["NCCL_HOME"]) / "include"
    import nvidia.nccl

    return pathlib.Path(next(iter(nvidia.nccl.__path__))) / "include"


def header_version(include: pathlib.Path) -> int:
    found = re.search(r"#define NCCL_VERSION_CODE (\d+)", (include / "nccl.h").read_text())
    if found is None:
        raise RuntimeError(f"no NCCL_VERSION_CODE in {include / 'nccl.h'}")
    return int(found.group(1))


def build():
    """The compiled extension module (cached by torch between runs)."""
    include = nccl_include_dir()
    code = header_version(include)
    extension = torch_nccl_core._C.nccl_header_version()
    if code != extension:
        raise RuntimeError(
            f"NCCL headers in {include} are {code}, but torch_nccl_core was built with "
            f"{extension}: set NCCL_INCLUDE_DIR to the headers the extension was built with"
        )
    return load(
        name=f"nccl_core_device_kernel_example_{code}",
        sources=[str(HERE / "exchange.cu")],
        extra_include_paths=[str(include)],
        extra_cuda_cflags=["-O2"],
        verbose=False,
    )

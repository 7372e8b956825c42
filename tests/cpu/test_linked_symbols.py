"""The extension links only NCCL symbols that NCCL 2.28 exports, so one build loads on 2.28 to 2.30.

Newer entry points (ncclPutSignal, ncclGetLsaDevicePointer, ncclCommQueryProperties, ...) are
looked up with dlsym at run time. A new name here must exist in NCCL 2.28, or be looked up too.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

import torch_nccl_core

NCCL_2_28_SYMBOLS_USED = {
    "ncclAllGather",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommDeregister",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitRankConfig",
    "ncclCommRegister",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclSend",
    "ncclTeamLsa",
}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_extension_links_only_nccl_2_28_symbols():
    library = pathlib.Path(torch_nccl_core._C.__file__)
    listing = subprocess.run(
        ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    linked = {
        line.split()[-1] for line in listing.splitlines() if line.split()[-1].startswith("nccl")
    }
    assert linked, "no NCCL symbol found: is this the extension?"
    assert linked <= NCCL_2_28_SYMBOLS_USED, sorted(linked - NCCL_2_28_SYMBOLS_USED)

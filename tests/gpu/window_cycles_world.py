"""One rank of a world of its own (a process per suite rank) that registers and closes a window
CYCLES times, then prints what it used: a JSON line with device memory, file descriptors and
resources left behind.

Started by test_communicator.test_window_register_close_cycles_leak_nothing, one process per
rank, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / NCCL_SOCKET_IFNAME set.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# this script's folder comes first on sys.path
from helpers import local_device, register_close_cycles

import torch_nccl_core

cycles = int(sys.argv[1])
rank = int(os.environ["RANK"])
device = local_device(rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl_core", device_id=device)
comm = torch_nccl_core.communicator()
report = register_close_cycles(comm, comm.register_window, cycles)
dist.destroy_process_group()
print(json.dumps(report), flush=True)

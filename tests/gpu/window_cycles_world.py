"""One rank of a two-process world that registers and closes a window CYCLES times, then prints
what it used: a JSON line with device memory, file descriptors and resources left behind.

Started by test_communicator.test_window_register_close_cycles_leak_nothing, one process per
rank, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / NCCL_SOCKET_IFNAME set.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_nccl_core

cycles = int(sys.argv[1])
rank = int(os.environ["RANK"])
device = torch.device("cuda", rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl_core", device_id=device)
comm = torch_nccl_core.communicator()
memory = torch_nccl_core.empty(1 << 20)
for _ in range(20):  # warm-up: NCCL's own first-use allocations
    comm.register_window(memory).close()
torch.cuda.synchronize()
free_before, _ = torch.cuda.mem_get_info()
fds_before, resources_before = len(os.listdir("/proc/self/fd")), comm._resource_count()
start = time.perf_counter()
for _ in range(cycles):
    comm.register_window(memory).close()
seconds = time.perf_counter() - start
torch.cuda.synchronize()
free_after, _ = torch.cuda.mem_get_info()
report = {
    "cycles": cycles,
    "ms_per_cycle": seconds / cycles * 1e3,
    "device_bytes_lost": free_before - free_after,
    "fds_gained": len(os.listdir("/proc/self/fd")) - fds_before,
    "resources_gained": comm._resource_count() - resources_before,
}
dist.destroy_process_group()
print(json.dumps(report), flush=True)

"""Exchange data between ranks from inside a kernel.

torchrun --nproc-per-node=2 examples/device_kernel/run.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import torch_nccl_core

sys.path.insert(0, os.path.dirname(__file__))
from build import build


def main() -> None:
    # Ranks may outnumber GPUs (python -m torch_nccl_core.launch): they share them then.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl_core", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    module = build()
    comm = torch_nccl_core.communicator()
    count = 1 << 16
    buf = torch_nccl_core.empty(2 * count, window=True)
    buf[:count].fill_(rank)
    window = comm.find_window(buf)
    dev = comm.create_dev_comm(torch_nccl_core.DevCommRequirements(lsa_barrier_count=1))
    module.exchange(dev.ptr, window.handle, count, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    expected = float((rank + 1) % world)
    assert torch.all(buf[count:] == expected), buf[count:]
    print(f"rank {rank}: received {expected:g} from rank {(rank + 1) % world}")
    dev.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

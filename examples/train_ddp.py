"""Train a small MLP with DistributedDataParallel on the nccl_core backend.

Run (one process per GPU):

    torchrun --nproc-per-node=2 examples/train_ddp.py [--backend nccl_core]
        [--steps 50] [--batch-size 256] [--lr 1e-3]

Each rank draws its own batches of a synthetic regression problem
(y = sin(x @ w) + noise, with the same w everywhere); DDP averages the
gradients across ranks with the chosen backend. Rank 0 prints the loss,
averaged over ranks, every 10 steps and ends with "final loss X".
`import torch_nccl_core` is all it takes to make backend "nccl_core" available;
`--backend nccl` runs the same script on PyTorch's built-in NCCL backend.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_DIM, HIDDEN = 32, 256


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="nccl_core")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def mean_over_ranks(x: torch.Tensor) -> float:
    x = x.detach().clone()
    dist.all_reduce(x)
    return x.item() / dist.get_world_size()


def main():
    args = parse_args()
    if args.backend == "nccl_core":
        import torch_nccl_core  # noqa: F401  (registers the "nccl_core" backend)

    # Ranks may outnumber GPUs (python -m torch_nccl_core.launch): they share them then.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, device_id=device)
    rank = dist.get_rank()

    torch.manual_seed(0)  # same target and initial weights on every rank
    w_true = torch.randn(IN_DIM, 1, device=device) / IN_DIM**0.5
    model = nn.Sequential(
        nn.Linear(IN_DIM, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    ).to(device)
    ddp = DDP(model, device_ids=[device.index])
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    data = torch.Generator(device=device).manual_seed(1 + rank)  # per-rank batches

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, IN_DIM, device=device, generator=data)
        noise = torch.randn(args.batch_size, 1, device=device, generator=data)
        y = torch.sin(x @ w_true) + 0.01 * noise
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # gradients are all-reduced here
        opt.step()
        if step % 10 == 0:
            avg = mean_over_ranks(loss)  # a collective: every rank takes part
            if rank == 0:
                print(f"step {step:4d}  loss {avg:.6f}", flush=True)

    final = mean_over_ranks(loss)
    if rank == 0:
        print(f"final loss {final:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

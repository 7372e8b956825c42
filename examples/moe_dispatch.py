"""MoE-style token dispatch and combine with put_signal / wait_signal, checked against
all_to_all_single, with the time of both.

    torchrun --nproc-per-node=2 examples/moe_dispatch.py [--tokens 8192] [--hidden 4096]

Each rank routes its tokens to experts living on every rank (expert e on rank e % world). The
token counts per destination are exchanged first (a tiny all_to_all); then each rank puts its
tokens for rank r straight into r's receive window at the offset r computed for it, raises one
signal, and waits for one signal from every peer. Combine sends the expert outputs (here: the
tokens times two) back the same way, into a second window in the origin's send order.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import torch_nccl_core
from torch_nccl_core import WaitSignalDesc


def starts(counts: list[int]) -> list[int]:
    """Where each block begins when blocks of these sizes are laid end to end."""
    return [sum(counts[:r]) for r in range(len(counts))]


def swap(values: list[int], device: torch.device) -> list[int]:
    """Send values[r] to rank r; return what each rank sent here (a tiny all_to_all)."""
    received = torch.empty(len(values), dtype=torch.int64, device=device)
    dist.all_to_all_single(received, torch.tensor(values, dtype=torch.int64, device=device))
    return received.tolist()


def exchange(comm, memory: torch.Tensor, window, blocks: list[torch.Tensor], at: list[int]):
    """Put blocks[r] into rank r's `memory` at element offset at[r] (a local copy for this rank),
    signal every peer once, and wait for one signal from every peer."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for r, block in enumerate(blocks):
        if r == rank:
            memory[at[r] : at[r] + block.numel()].copy_(block.reshape(-1))
        elif block.numel():
            comm.put_signal(block, r, window, offset=at[r])
        else:
            comm.signal(r)
    comm.wait_signal([WaitSignalDesc(r) for r in range(world) if r != rank])


class Dispatch:
    """One rank's tokens routed to experts on every rank (expert e on rank e % world)."""

    def __init__(self, tokens: torch.Tensor, seed: int):
        device, world = tokens.device, dist.get_world_size()
        self.tokens, self.hidden = tokens, tokens.shape[1]
        generator = torch.Generator(device=device).manual_seed(seed)
        dest = torch.randint(0, world, (len(tokens),), device=device, generator=generator)
        self.order = torch.argsort(dest, stable=True)
        self.send = tokens[self.order].contiguous()
        self.send_splits = torch.bincount(dest, minlength=world).tolist()
        self.recv_splits = swap(self.send_splits, device)
        # Where each source's tokens start here, where mine start in each peer's window, and
        # where each source wants its tokens back (its send order).
        self.recv_offsets = starts(self.recv_splits)
        self.put_offsets = swap(self.recv_offsets, device)
        self.back_offsets = swap(starts(self.send_splits), device)
        self.comm = torch_nccl_core.communicator()
        # Receive window: room for the most tokens any rank can get (all of everyone's).
        self.inbox = torch_nccl_core.empty(tokens.numel() * world, dtype=tokens.dtype, window=True)
        self.returns = torch_nccl_core.empty(tokens.numel(), dtype=tokens.dtype, window=True)
        self.inbox_window = self.comm.find_window(self.inbox)
        self.returns_window = self.comm.find_window(self.returns)

    def one_sided(self) -> torch.Tensor:
        blocks = list(self.send.split(self.send_splits))
        offsets = [o * self.hidden for o in self.put_offsets]  # mine: my own receive offset
        exchange(self.comm, self.inbox, self.inbox_window, blocks, offsets)
        return self.inbox[: sum(self.recv_splits) * self.hidden].view(-1, self.hidden)

    def collective(self) -> torch.Tensor:
        out = self.send.new_empty(sum(self.recv_splits), self.hidden)
        dist.all_to_all_single(out, self.send, self.recv_splits, self.send_splits)
        return out

    def combine_one_sided(self, expert_out: torch.Tensor) -> torch.Tensor:
        blocks = list(expert_out.split(self.recv_splits))
        offsets = [o * self.hidden for o in self.back_offsets]
        exchange(self.comm, self.returns, self.returns_window, blocks, offsets)
        return self._unsorted(self.returns.view(-1, self.hidden))

    def combine_collective(self, expert_out: torch.Tensor) -> torch.Tensor:
        back = torch.empty_like(self.send)
        dist.all_to_all_single(back, expert_out, self.send_splits, self.recv_splits)
        return self._unsorted(back)

    def _unsorted(self, in_send_order: torch.Tensor) -> torch.Tensor:
        combined = torch.empty_like(self.tokens)
        combined[self.order] = in_send_order
        return combined


def timed(fn, iters: int) -> tuple[torch.Tensor, float]:
    """fn's last result and its time per call in us, a barrier after each call (a window is
    rewritten by the next call: every rank must have read it)."""
    for _ in range(3):
        fn()
        dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        result = fn()
        dist.barrier()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    # Ranks may outnumber GPUs (python -m torch_nccl_core.launch): they share them then.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl_core", device_id=device)
    tokens = torch.randn(args.tokens, args.hidden, device=device, dtype=torch.bfloat16)
    moe = Dispatch(tokens, seed=dist.get_rank())

    got, one_sided_us = timed(moe.one_sided, args.iters)
    want, collective_us = timed(moe.collective, args.iters)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    expert_out = (want * 2).contiguous()  # the experts' work
    back, combine_one_sided_us = timed(lambda: moe.combine_one_sided(expert_out), args.iters)
    back_ref, combine_collective_us = timed(lambda: moe.combine_collective(expert_out), args.iters)
    torch.testing.assert_close(back, back_ref, rtol=0, atol=0)
    torch.testing.assert_close(back, tokens * 2, rtol=0, atol=0)
    if dist.get_rank() == 0:
        print(
            f"{args.tokens} tokens x {args.hidden} per rank; times include a barrier each:\n"
            f"  dispatch: put_signal {one_sided_us:.1f} us, "
            f"all_to_all_single {collective_us:.1f} us\n"
            f"  combine:  put_signal {combine_one_sided_us:.1f} us, "
            f"all_to_all_single {combine_collective_us:.1f} us\n"
            "  results identical to all_to_all_single, and combine returns every token home"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What the benchmarks run: memory variants (how buffers are allocated) and ops (one collective at
one size, owning its buffers, with known inputs and the results they must give).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .expected import rank_fill, summed_fills

DTYPE = torch.float32
ELEM = 4  # bytes per float32 element


# ----------------------------------------------------------------------------
# Memory variants: how benchmark buffers are allocated.
# ----------------------------------------------------------------------------


class PlainVariant:
    """Tensors from PyTorch's caching allocator, as ordinary user code gets them."""

    def __init__(self, device: torch.device, groups: dict[str, dist.ProcessGroup]):
        self.device = device

    def empty(self, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=DTYPE, device=self.device)

    def close(self) -> None:
        pass


def _group_of(groups: dict[str, dist.ProcessGroup], backend: str) -> dist.ProcessGroup:
    for group in groups.values():
        if dist.get_backend(group) == backend:
            return group
    raise SystemExit(f"this variant needs a {backend} group in --backends")


class NcclMemVariant(PlainVariant):
    """NCCL memory (torch_nccl_core.empty): nccl_core registers it on first use."""

    def empty(self, numel: int) -> torch.Tensor:
        import torch_nccl_core

        return torch_nccl_core.empty(numel, dtype=DTYPE, device=self.device)


class WindowVariant(PlainVariant):
    """NCCL memory registered as a symmetric window of the nccl_core group."""

    def __init__(self, device: torch.device, groups: dict[str, dist.ProcessGroup]):
        super().__init__(device, groups)
        self.group = _group_of(groups, "nccl_core")

    def empty(self, numel: int) -> torch.Tensor:
        import torch_nccl_core

        return torch_nccl_core.empty(
            numel, dtype=DTYPE, device=self.device, group=self.group, window=True
        )


class NcclPoolVariant(PlainVariant):
    """The built-in backend's own MemPool, registered with its communicator."""

    def __init__(self, device: torch.device, groups: dict[str, dist.ProcessGroup]):
        super().__init__(device, groups)
        self.backend = _group_of(groups, "nccl")._get_backend(device)
        self.pool = torch.cuda.MemPool(self.backend.mem_allocator)
        self.backend.register_mem_pool(self.pool)

    def empty(self, numel: int) -> torch.Tensor:
        with torch.cuda.use_mem_pool(self.pool):
            return torch.empty(numel, dtype=DTYPE, device=self.device)

    def close(self) -> None:
        self.backend.deregister_mem_pool(self.pool)
        del self.pool


# name -> class(device, groups) providing .empty(numel) and .close().
VARIANTS = {
    "plain": PlainVariant,
    "nccl_mem": NcclMemVariant,
    "window": WindowVariant,
    "nccl_pool": NcclPoolVariant,
}


@dataclass
class Env:
    """What an op needs of its rank: where it runs and how its buffers are allocated."""

    rank: int
    world: int
    device: torch.device
    empty: Callable[[int], torch.Tensor]


@contextlib.contextmanager
def variant_envs(
    names: list[str], device: torch.device, groups: dict[str, dist.ProcessGroup]
) -> Iterator[dict[str, Env]]:
    """An Env per memory variant named, for this rank; the variants are closed after a normal
    exit (not after an error: the other ranks may not get that far)."""
    variants = {name: VARIANTS[name](device, groups) for name in names}
    rank, world = dist.get_rank(), dist.get_world_size()
    yield {name: Env(rank, world, device, v.empty) for name, v in variants.items()}
    for variant in variants.values():
        variant.close()


# ----------------------------------------------------------------------------
# Ops: one instance = one op at one size, owning its buffers.
# ----------------------------------------------------------------------------


class Op:
    """Base class. Subclasses allocate in __init__ and define call/fill/check."""

    name = ""
    split = False  # buffer is cut into world-size chunks
    capturable = True  # can be captured in a CUDA graph

    def __init__(self, nbytes: int, env: Env):
        self.nbytes, self.env, self.bufs = nbytes, env, []

    @classmethod
    def sizes(cls, candidates: list[int], world: int) -> list[int]:
        """The candidate sizes this op can run at."""
        step = world * ELEM if cls.split else ELEM
        return [n for n in candidates if n % step == 0]

    @staticmethod
    def bus_factor(n: int) -> float | None:
        return 1.0

    def alloc(self, numel: int) -> torch.Tensor:
        t = self.env.empty(numel)
        self.bufs.append(t)
        return t

    @property
    def numel(self) -> int:
        return self.nbytes // ELEM

    def chunk_ids(self) -> torch.Tensor:
        """[0, 0, ..., 1, 1, ..., n-1]: the chunk index of each element."""
        ids = torch.arange(self.env.world, dtype=DTYPE, device=self.env.device)
        return ids.repeat_interleave(self.numel // self.env.world)

    def call(self, group: dist.ProcessGroup) -> None:
        raise NotImplementedError

    def fill(self) -> None:
        """Write known inputs for the correctness check."""

    def check(self) -> str | None:
        """After one call on fill()'s inputs: None if right, else what is wrong."""
        return None

    def zero(self) -> None:
        for t in self.bufs:
            t.zero_()


def mismatch(got: torch.Tensor, want: torch.Tensor | float) -> str | None:
    want = torch.as_tensor(want, dtype=got.dtype, device=got.device).expand_as(got)
    bad = (got != want).nonzero()
    if len(bad) == 0:
        return None
    i = bad[0].item()
    return (
        f"{len(bad)} of {got.numel()} elements wrong, "
        f"e.g. [{i}] = {got[i].item()} (want {want[i].item()})"
    )


class InPlaceOp(Op):
    """An op on one buffer, in place (all-reduce, broadcast, reduce); rank r fills it with
    rank_fill(r)."""

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.x = self.alloc(self.numel)

    def fill(self):
        self.x.fill_(rank_fill(self.env.rank))


class AllReduce(InPlaceOp):
    name = "all_reduce"

    @staticmethod
    def bus_factor(n):
        return 2 * (n - 1) / n

    def call(self, group):
        dist.all_reduce(self.x, group=group)

    def check(self):
        return mismatch(self.x, summed_fills(self.env.world))


class Broadcast(InPlaceOp):
    name = "broadcast"

    def call(self, group):
        dist.broadcast(self.x, src=0, group=group)

    def check(self):
        return mismatch(self.x, rank_fill(0))  # the root's fill


class Reduce(InPlaceOp):
    name = "reduce"

    def call(self, group):
        dist.reduce(self.x, dst=0, group=group)

    def check(self):
        return mismatch(self.x, summed_fills(self.env.world)) if self.env.rank == 0 else None


class SplitOp(Op):
    """An op whose buffer is cut into world-size chunks (all-gather, reduce-scatter, all-to-all).

    `name` is the torch.distributed function, called as f(out, inp, group=group).
    """

    split = True
    one_chunk = ""  # the buffer ("inp" or "out") that holds one chunk, not the whole

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        chunk = self.numel // env.world
        self.inp = self.alloc(chunk if self.one_chunk == "inp" else self.numel)
        self.out = self.alloc(chunk if self.one_chunk == "out" else self.numel)

    @staticmethod
    def bus_factor(n):
        return (n - 1) / n

    def call(self, group):
        getattr(dist, self.name)(self.out, self.inp, group=group)


class AllGather(SplitOp):
    name = "all_gather_into_tensor"
    one_chunk = "inp"

    def fill(self):
        self.inp.fill_(rank_fill(self.env.rank))
        self.out.fill_(-1)

    def check(self):
        return mismatch(self.out, rank_fill(self.chunk_ids()))


class ReduceScatter(SplitOp):
    name = "reduce_scatter_tensor"
    one_chunk = "out"

    def fill(self):
        self.inp.copy_(rank_fill(self.chunk_ids()) * rank_fill(self.env.rank))
        self.out.fill_(-1)

    def check(self):
        rank, world = self.env.rank, self.env.world
        return mismatch(self.out, rank_fill(rank) * summed_fills(world))


class AllToAll(SplitOp):
    name = "all_to_all_single"

    def fill(self):
        # chunk j of rank r's input carries r * world + j
        self.inp.copy_(self.env.rank * self.env.world + self.chunk_ids())
        self.out.fill_(-1)

    def check(self):
        return mismatch(self.out, self.chunk_ids() * self.env.world + self.env.rank)


class SendRecv(Op):
    """Ring exchange: send to rank + 1, receive from rank - 1, one batch."""

    name = "send_recv"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.send = self.alloc(self.numel)
        self.recv = self.alloc(self.numel)
        self.next = (env.rank + 1) % env.world
        self.prev = (env.rank - 1) % env.world

    @classmethod
    def sizes(cls, candidates, world):
        return super().sizes(candidates, world) if world > 1 else []

    def call(self, group):
        ops = [
            dist.P2POp(dist.isend, self.send, self.next, group),
            dist.P2POp(dist.irecv, self.recv, self.prev, group),
        ]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    def fill(self):
        self.send.fill_(rank_fill(self.env.rank))
        self.recv.fill_(-1)

    def check(self):
        return mismatch(self.recv, rank_fill(self.prev))


class PutSignal(SendRecv):
    """Ring put: put_signal into rank + 1's window, wait for rank - 1's signal (nccl_core).

    Other backends run the send/recv ring of the same size: the operation it replaces.
    """

    name = "put_signal"

    def __init__(self, nbytes, env):
        super().__init__(nbytes, env)
        self.plain_recv = self.recv
        self.windows: dict[str, tuple] = {}

    def _window(self, group):
        # Registered on the first call, which every rank makes together.
        if group.group_name not in self.windows:
            import torch_nccl_core

            memory = torch_nccl_core.empty(self.numel, dtype=DTYPE, group=group, window=True)
            comm = torch_nccl_core.communicator(group)
            self.windows[group.group_name] = (comm, memory, comm.find_window(memory))
        return self.windows[group.group_name]

    def call(self, group):
        if dist.get_backend(group) != "nccl_core":
            self.recv = self.plain_recv
            return super().call(group)
        import torch_nccl_core

        comm, memory, window = self._window(group)
        comm.put_signal(self.send, self.next, window)
        comm.wait_signal(torch_nccl_core.WaitSignalDesc(self.prev))
        self.recv = memory

    def fill(self):
        self.send.fill_(rank_fill(self.env.rank))
        for _, memory, _ in self.windows.values():
            memory.fill_(-1)
        self.plain_recv.fill_(-1)


class Barrier(Op):
    name = "barrier"
    capturable = False  # waits on the host

    @classmethod
    def sizes(cls, candidates, world):
        return [0]

    @staticmethod
    def bus_factor(n):
        return None

    def call(self, group):
        dist.barrier(group=group)


OPS = {
    cls.name: cls
    for cls in (
        AllReduce,
        Broadcast,
        Reduce,
        AllGather,
        ReduceScatter,
        AllToAll,
        SendRecv,
        PutSignal,
        Barrier,
    )
}


# Ops whose buffers a memory variant provides (put_signal's target and barrier have none).
MEMORY_OPS = [name for name in OPS if name not in ("put_signal", "barrier")]

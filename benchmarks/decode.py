"""Tensor-parallel decode on one backend: bf16 all-reduces of a decode step's sizes, eagerly and
captured in CUDA graphs, and one tensor-parallel transformer layer's decode step in a graph.

Compare backends each in its own processes, runs interleaved (it starts torchrun itself):

    python -m benchmarks.interleaved --module benchmarks.decode --nproc 2 --repeats 3 \\
        --out results/ --run nccl=nccl --run nccl_core=nccl_core \\
        --run "auto=nccl_core TORCH_NCCL_CORE_ALL_REDUCE_KERNELS=auto"

or alone: ``python -m torch_nccl_core.launch --nproc-per-node 2 -m benchmarks.decode
--backends nccl_core --out results/``.

Rows (OUT/decode.csv), per (variant, op, bytes):
- variant ``eager``: one op per call; ``graph10``, ``graph100``: that many ops captured in one
  graph, time per op; ``layer``: one decode step of the layer in a graph;
- op ``all_reduce`` (8 B - 4 KiB), ``all_reduce h<hidden>`` (``[tokens, hidden]``, tokens 1-512),
  ``all_gather`` and ``reduce_scatter`` (bytes: the larger tensor, 1 KiB - 8 MiB),
  ``layer h<hidden> t<tokens>`` (bytes: one of its all_reduces);
- time_us per op or step (the ranks' max), host_us the host time of a call or of a replay per op.
The layer: pre-norm attention over a KV cache (``--context``) and an MLP (4 x hidden), their
first linears column-parallel and second row-parallel (Megatron-LM's split), each ending in an
all_reduce. Every size's all_reduce is checked first, eagerly and in a graph.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .cli import (
    add_backend_arguments,
    add_init_backend_argument,
    comma_list,
    parse_bytes,
    run_one_backend,
)
from .timing import rank_max, timed_loop

DTYPE = torch.bfloat16
ELEM = 2


def int_list(text: str) -> list[int]:
    return [int(s) for s in comma_list()(text)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_backend_arguments(p, "the backend measured (one)")
    add_init_backend_argument(p)
    p.add_argument("--small", type=comma_list(), default=["8", "64", "512", "4K"], help="bytes")
    p.add_argument("--hidden", type=int_list, default=[4096, 8192])
    p.add_argument("--tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    p.add_argument(
        "--gather-scatter",
        type=comma_list(),
        default=["1K", "16K", "64K", "256K", "1M", "2M", "4M", "8M"],
        help="bytes of the larger tensor of all_gather and reduce_scatter",
    )
    p.add_argument("--graph-ops", type=int_list, default=[10, 100], help="ops per graph")
    p.add_argument("--layer-tokens", type=int_list, default=[1, 4, 16, 64])
    p.add_argument("--layer-hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--context", type=int, default=1024, help="KV cache length of the layer")
    p.add_argument("--target-ms", type=float, default=20.0, help="time per measurement")
    args = p.parse_args(argv)
    if len(args.backends) != 1:
        p.error("--backends names one backend (compare backends with benchmarks.interleaved)")
    args.backend_labels = args.backends
    args.small = [parse_bytes(s) for s in args.small]
    if any(b < ELEM or b % ELEM for b in args.small):
        p.error(f"--small sizes must be positive multiples of {ELEM} bytes")
    args.gather_scatter = [parse_bytes(s) for s in args.gather_scatter]
    return args


def sizes(args) -> list[tuple[str, int]]:
    """(op, numel) of every all_reduce measured."""
    cases = [("all_reduce", b // ELEM) for b in args.small]
    return cases + [(f"all_reduce h{h}", t * h) for h in args.hidden for t in args.tokens]


def filled(numel: int, device: torch.device) -> torch.Tensor:
    """rank + 1 everywhere: small integers, exact in bf16 through the sums checked."""
    return torch.full((numel,), dist.get_rank() + 1, dtype=DTYPE, device=device)


def check(tensor: torch.Tensor, expected: float | torch.Tensor, what: str) -> None:
    """Every rank raises if any rank's result is wrong (agreed over the default group)."""
    wrong = not bool((tensor == expected).all())
    if wrong:
        shown = expected if isinstance(expected, float) else expected[:4].tolist()
        print(f"{what}: wrong result {tensor[:4].tolist()}, expected {shown}", flush=True)
    if rank_max(float(wrong))[0]:
        raise SystemExit(f"{what}: a wrong result (see the ranks' output)")


def capture(fn, calls: int) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def timed(fn, sync, target_ms: float) -> tuple[float, float]:
    """(s per call, host s per call) of fn, the ranks' max, ~target_ms of calls."""
    probe, _ = timed_loop(fn, 3, sync)
    (probe,) = rank_max(probe)  # every rank runs the same number of calls
    iters = max(5, min(2000, round(target_ms / 1e3 / max(probe, 1e-9))))
    rank_max(0.0)
    return tuple(rank_max(*timed_loop(fn, iters, sync)))


def op_rows(args, sync, row: dict, fn, check_replay) -> list[dict]:
    """Rows of `fn` (one op) eagerly and captured args.graph_ops times per graph;
    check_replay(calls) checks the result of one replay of such a graph."""
    per, host = timed(fn, sync, args.target_ms)
    rows = [{**row, "variant": "eager", "time_us": per * 1e6, "host_us": host * 1e6}]
    for calls in args.graph_ops:
        graph = capture(fn, calls)
        check_replay(graph, calls)
        per, host = timed(graph.replay, sync, args.target_ms)
        rows.append(
            {**row, "variant": f"graph{calls}", "time_us": per / calls * 1e6,
             "host_us": host / calls * 1e6}
        )  # fmt: skip
        del graph
    print(" ".join(f"{r['variant']} {r['time_us']:.2f} us" for r in rows), row["op"], row["bytes"])
    return rows


def all_reduce_rows(args, group, device, sync) -> list[dict]:
    world = dist.get_world_size()
    total = world * (world + 1) / 2
    rows = []
    for op, numel in sizes(args):
        tensor = filled(numel, device)
        dist.all_reduce(tensor, group=group)  # eager first: a backend may set up here
        check(tensor, total, f"eager {op} {numel}")

        def check_replay(graph, calls, t=tensor, op=op, numel=numel):
            t.fill_(dist.get_rank() + 1)
            graph.replay()
            # Sums of rank + 1, then calls - 1 times multiplied by the world: exact in bf16 where
            # the world is a power of 2 (a small integer times one), inf past bf16's range
            # (then left unchecked, as other worlds are).
            expected = total * float(world) ** (calls - 1)
            if expected < 1e38 and world & (world - 1) == 0:
                check(t, expected, f"graph{calls} {op} {numel}")

        rows += op_rows(
            args,
            sync,
            {"op": op, "bytes": numel * ELEM},
            lambda t=tensor: dist.all_reduce(t, group=group),
            check_replay,
        )
    return rows


def gather_scatter_rows(args, group, device, sync) -> list[dict]:
    """all_gather_into_tensor and reduce_scatter_tensor; bytes: the larger tensor's."""
    world = dist.get_world_size()
    rows = []
    for op in ("all_gather", "reduce_scatter"):
        for size in args.gather_scatter:
            part = filled(size // ELEM // world, device)
            whole = filled(part.numel() * world, device)
            if op == "all_gather":
                expected = torch.arange(1, world + 1, device=device, dtype=DTYPE)
                expected = expected.repeat_interleave(part.numel())
                result = whole

                def fn(out=whole, src=part):
                    dist.all_gather_into_tensor(out, src, group=group)
            else:
                expected = world * (world + 1) / 2
                result = part

                def fn(out=part, src=whole):
                    dist.reduce_scatter_tensor(out, src, group=group)

            def verify(what, out=result, want=expected):
                check(out, want, what)

            fn()  # eager first: a backend may set up here
            verify(f"eager {op} {size}")

            def check_replay(graph, calls, out=result, op=op, size=size, verify=verify):
                out.zero_()
                graph.replay()
                verify(f"graph{calls} {op} {size}")

            rows += op_rows(args, sync, {"op": op, "bytes": size}, fn, check_replay)
    return rows


class TensorParallelLayer:
    """A decode step of one transformer layer, its heads and MLP split over the group's ranks."""

    def __init__(self, args, tokens: int, group, device: torch.device):
        world = dist.get_world_size(group)
        hidden, heads = args.layer_hidden, args.heads
        if heads % world or hidden % heads:
            raise SystemExit(f"--heads {heads} must split over {world} ranks and divide hidden")
        self.local_heads, self.head_dim = heads // world, hidden // heads
        width = self.local_heads * self.head_dim
        g = torch.Generator(device=device).manual_seed(1234 + dist.get_rank())

        def weight(*shape):
            return torch.randn(*shape, generator=g, device=device, dtype=DTYPE) * 0.02

        self.qkv, self.out = weight(hidden, 3 * width), weight(width, hidden)
        inner = 4 * hidden // world
        self.up, self.down = weight(hidden, inner), weight(inner, hidden)
        cache = (tokens, self.local_heads, args.context, self.head_dim)
        self.keys, self.values = weight(*cache), weight(*cache)
        self.x = weight(tokens, hidden)
        self.group = group

    def step(self) -> torch.Tensor:
        tokens, hidden = self.x.shape
        h = F.layer_norm(self.x, (hidden,))
        q, _, _ = (h @ self.qkv).split(self.local_heads * self.head_dim, dim=-1)
        q = q.view(tokens, self.local_heads, 1, self.head_dim)
        attended = F.scaled_dot_product_attention(q, self.keys, self.values)
        o = attended.reshape(tokens, -1) @ self.out
        dist.all_reduce(o, group=self.group)
        x = self.x + o
        m = F.gelu(F.layer_norm(x, (hidden,)) @ self.up) @ self.down
        dist.all_reduce(m, group=self.group)
        return x + m


def layer_rows(args, group, device, sync) -> list[dict]:
    rows = []
    for tokens in args.layer_tokens:
        layer = TensorParallelLayer(args, tokens, group, device)
        for _ in range(3):
            layer.step()  # eager first: a backend may set up here
        graph = capture(layer.step, 1)
        per, host = timed(graph.replay, sync, args.target_ms)
        rows.append(
            {"variant": "layer", "op": f"layer h{args.layer_hidden} t{tokens}",
             "bytes": tokens * args.layer_hidden * ELEM, "time_us": per * 1e6,
             "host_us": host * 1e6}
        )  # fmt: skip
        print(f"layer t{tokens}: {per * 1e6:.2f} us per step", flush=True)
        del graph, layer
    return rows


def measure(args, group, device, sync) -> list[dict]:
    if device.type != "cuda":
        raise SystemExit("benchmarks.decode needs a GPU per rank")
    return (
        all_reduce_rows(args, group, device, sync)
        + gather_scatter_rows(args, group, device, sync)
        + layer_rows(args, group, device, sync)
    )


def main(argv: list[str] | None = None) -> None:
    run_one_backend(parse_args(argv), measure, "decode", "Tensor-parallel decode")


if __name__ == "__main__":
    main()

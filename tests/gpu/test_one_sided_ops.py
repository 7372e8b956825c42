"""torch.ops.nccl_core one-sided ops: eager, captured in a CUDA graph, under torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core
from torch_nccl_core import ops

from .helpers import assert_equal, needs_ranks, one_sided_refused, rank_tensor, ring_peers

NUMEL = 2048


def _window() -> torch.Tensor:
    window = torch_nccl_core.empty(NUMEL, window=True)
    window.zero_()
    torch.cuda.synchronize()
    dist.barrier()
    return window


@needs_ranks(2)  # one-sided ops go to another rank
def test_ops_eager_exchange(rank, world_size, windows):
    window = _window()
    after, before = ring_peers(rank)
    src = rank_tensor(NUMEL, torch.float32, rank)
    if one_sided_refused(lambda: ops.put_signal(src, window, after)):
        return
    ops.put_signal(src, window, after)
    received = ops.wait_signal(window, before)
    torch.cuda.synchronize()
    dist.barrier()
    assert_equal(received, rank_tensor(NUMEL, torch.float32, before))


@needs_ranks(2)  # one-sided ops go to another rank
def test_ring_exchange_replays_in_a_cuda_graph(rank, windows):
    """Capture put / wait / ack once, replay 100 times with new data, check every result."""
    window = _window()
    after, before = ring_peers(rank)
    src = torch.zeros(NUMEL, device="cuda")
    out = torch.zeros(NUMEL, device="cuda")
    if one_sided_refused(lambda: ops.put_signal(src, window, after)):  # refused eagerly
        return
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.put_signal(src, window, after)  # data
        out.copy_(ops.wait_signal(window, before))  # the previous rank's data
        ops.signal(window, before)  # ack: its data was read
        ops.wait_signal(window, after)  # the next rank read ours: its window may be rewritten
    torch.cuda.synchronize()
    dist.barrier()
    results = []
    for step in range(100):
        src.copy_(rank_tensor(NUMEL, torch.float32, rank, salt=step))
        graph.replay()
        results.append(out.clone())
    torch.cuda.synchronize()
    dist.barrier()
    for step, result in enumerate(results):
        assert_equal(result, rank_tensor(NUMEL, torch.float32, before, salt=step))


# Every way a program compiles them (torch.compile's backends, a whole graph, CUDA graphs).
COMPILE_MODES = {
    "aot_eager": {"backend": "aot_eager"},
    "inductor": {},
    "fullgraph": {"fullgraph": True},
    "reduce-overhead": {"mode": "reduce-overhead"},
}


@needs_ranks(2)  # one-sided ops go to another rank
@pytest.mark.parametrize("how", COMPILE_MODES)
def test_compiled_exchanges_keep_their_order_and_data(rank, how, windows):
    """A function that computes what it sends, puts it, waits for the peer's and reads it, under
    each way of compiling it, called three times (CUDA graphs record, then replay) with new data.
    Was: aot_eager handed the ops a copy of the window (a mutated argument), refused as not
    window memory; a graph-writing copy back would have overwritten what peers put."""
    window = _window()
    after, before = ring_peers(rank)
    name = dist.group.WORLD.group_name
    torch._dynamo.mark_static_address(window)  # CUDA graphs must not copy peer memory

    def exchange(x: torch.Tensor, win: torch.Tensor) -> torch.Tensor:
        data = x * 2 + 1  # computed before the put that sends it
        torch.ops.nccl_core.put_signal(data, win, after, 0, name)
        received = torch.ops.nccl_core.wait_signal(win, [before], [1], name)
        return received * 3  # read after the wait: its data is the wait's

    torch._dynamo.reset()
    compiled = torch.compile(exchange, **COMPILE_MODES[how])
    x = rank_tensor(NUMEL, torch.float32, rank)
    if one_sided_refused(lambda: compiled(x, window)):  # the compiled op refuses alike
        return
    results = []
    for step in range(3):
        result = compiled(rank_tensor(NUMEL, torch.float32, rank, salt=step), window)
        results.append(result.clone())
        torch.cuda.synchronize()
        dist.barrier()  # the peer read its window before it is written again
    for step, result in enumerate(results):
        expected = (rank_tensor(NUMEL, torch.float32, before, salt=step) * 2 + 1) * 3
        assert_equal(result, expected)

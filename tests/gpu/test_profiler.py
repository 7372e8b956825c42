"""torch.profiler sees nccl_core's ops as it sees the built-in backend's: a `nccl_core:<op>` range
with the op's input shapes around its launch, torch's `record_param_comms` event with the op's
sequence number and sizes, and the op's NCCL kernel on the CUDA timeline; in a DDP step too."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile

from .helpers import ASYNC_MODES, complete, ring_peers
from .training import batches, model

NUMEL = 1024
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _profiled(rank: int, async_op: bool):
    tensor = torch.ones(NUMEL, device="cuda")
    received = torch.empty(NUMEL, device="cuda")
    after, before = ring_peers(rank)
    with profile(activities=ACTIVITIES, record_shapes=True) as prof:
        complete(dist.all_reduce(tensor, async_op=async_op), async_op)
        complete(dist.broadcast(tensor, src=0, async_op=async_op), async_op)
        exchange = [dist.P2POp(dist.isend, tensor, after), dist.P2POp(dist.irecv, received, before)]
        for work in dist.batch_isend_irecv(exchange):
            work.wait()
        torch.cuda.synchronize()
    return prof.events()


@pytest.mark.parametrize("async_op", ASYNC_MODES)
def test_ops_appear_in_the_profiler_with_shapes_and_kernels(rank, async_op):
    events = _profiled(rank, async_op)
    ranges = {  # the CPU ranges (each has a twin on the CUDA timeline, without shapes)
        event.name: event
        for event in events
        if event.name.startswith("nccl_core:") and event.device_type == DeviceType.CPU
    }
    # torch's names of the ops, as ProcessGroupNCCL's ranges have them ("nccl:all_reduce"), and
    # async events as its Work's are: torch's DDP profiling test looks for both.
    after, before = ring_peers(rank)
    named = {
        "nccl_core:all_reduce",
        "nccl_core:broadcast",
        f"nccl_core:send {rank}->{after}",
        f"nccl_core:recv {rank}<-{before}",
    }
    assert named <= set(ranges), sorted(ranges)
    assert all(ranges[name].is_async for name in named)
    assert [NUMEL] in ranges["nccl_core:all_reduce"].input_shapes
    assert any(event.name == "record_param_comms" for event in events)
    kernels = [
        event.name
        for event in events
        if event.device_type == DeviceType.CUDA and "nccl" in event.name.lower()
    ]
    assert kernels, "no NCCL kernel on the CUDA timeline"


def test_a_ddp_step_shows_its_gradient_all_reduce_on_both_timelines(rank, device):
    """A profiled DDP step, as a user takes one: each gradient bucket's all_reduce is a
    `nccl_core:all_reduce` range with the bucket's size on the CPU timeline, and the range is on
    the CUDA timeline too (kineto's annotation of a user-scope range around the GPU work)."""
    ddp = DistributedDataParallel(model(), device_ids=[device.index])
    (warm_inputs, warm_targets), (inputs, targets) = batches(rank, 2)
    F.mse_loss(ddp(warm_inputs), warm_targets).backward()  # DDP rebuilds its buckets after it
    torch.cuda.synchronize()
    with profile(activities=ACTIVITIES, record_shapes=True) as prof:
        F.mse_loss(ddp(inputs), targets).backward()
        torch.cuda.synchronize()
    ranges = [event for event in prof.events() if event.name == "nccl_core:all_reduce"]
    on_cpu = [event for event in ranges if event.device_type == DeviceType.CPU]
    on_cuda = [event for event in ranges if event.device_type == DeviceType.CUDA]
    assert on_cpu and all(event.input_shapes for event in on_cpu), on_cpu
    buckets = [event.input_shapes[0] for event in on_cpu]
    assert sum(shape[0] for shape in buckets) == sum(p.numel() for p in ddp.parameters()), buckets
    assert on_cuda, sorted({(event.name, str(event.device_type)) for event in prof.events()})


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=["real", "complex"])
def test_a_profiled_op_is_one_range_with_its_inputs_shapes(rank, world_size, dtype):
    """What torch's distributed_test.py checks of every profiled op (call_dist_op), with the
    autograd profiler: one async `nccl_core:<op>` event, recorded once, whose input shapes are
    the op's input's (a complex one's as the real view NCCL moves), as ProcessGroupNCCL's Work
    records them. Was: the outputs' shapes too (3 shapes for an all_gather of 2 ranks)."""
    tensor = torch.ones(NUMEL, dtype=dtype, device="cuda")
    gathered = [torch.empty_like(tensor) for _ in range(world_size)]
    square = torch.ones(world_size, world_size, dtype=dtype, device="cuda")
    exchanged = torch.empty_like(square)
    calls = {
        "nccl_core:all_gather": (lambda: dist.all_gather(gathered, tensor), tensor),
        "nccl_core:all_to_all": (lambda: dist.all_to_all_single(exchanged, square), square),
    }
    seen = {}
    for title, (call, source) in calls.items():
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            call()
        seen[title] = [
            (event.is_async, event.count, event.input_shapes)
            for event in prof.function_events
            if event.name.startswith(title) or event.name.endswith(title)
        ]
        shape = torch.view_as_real(source).shape if source.is_complex() else source.shape
        seen[title] = (seen[title], [(True, 1, [list(shape)])])
    torch.cuda.synchronize()
    for title, (events, expected) in seen.items():
        assert events == expected, title

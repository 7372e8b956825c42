"""The backend at one rank: every op gives the one-rank result, eagerly and in CUDA graphs, seen by
the profiler, the flight recorder and Work timing; bad input leaves the group usable; teardown and
re-initialisation in the same process.

At one rank NCCL leaves an in-place op's tensor as it is, so only out-of-place ops and PREMUL_SUM
check that the backend hands NCCL the right buffers; the in-place ones check that the op runs."""

from __future__ import annotations

import pickle
import time

import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torch_nccl_core

NUMEL = 1024
ASYNC = [False, True]


def finish(work: dist.Work | None, async_op: bool) -> None:
    if async_op:
        work.wait()
    torch.cuda.synchronize()


def data(scale: float = 1.0) -> torch.Tensor:
    return torch.arange(NUMEL, dtype=torch.float32, device="cuda") * scale


@pytest.mark.parametrize("async_op", ASYNC, ids=["sync", "async"])
def test_every_collective_gives_the_one_rank_result(group, async_op):
    x = data()
    results = {}
    for name, op in [
        ("sum", dist.ReduceOp.SUM),
        ("avg", dist.ReduceOp.AVG),
        ("max", dist.ReduceOp.MAX),
        ("premul_sum", dist._make_nccl_premul_sum(3.0)),
    ]:
        y = data()
        finish(dist.all_reduce(y, op=op, async_op=async_op), async_op)
        results[f"all_reduce {name}"] = (y, data(3.0 if name == "premul_sum" else 1.0))
    y = data()
    finish(dist.broadcast(y, src=0, async_op=async_op), async_op)
    results["broadcast"] = (y, data())
    y = data()
    finish(dist.reduce(y, dst=0, async_op=async_op), async_op)
    results["reduce"] = (y, data())
    for name, call in [
        ("all_gather_into_tensor", lambda o: dist.all_gather_into_tensor(o, x, async_op=async_op)),
        ("reduce_scatter_tensor", lambda o: dist.reduce_scatter_tensor(o, x, async_op=async_op)),
        ("all_to_all_single", lambda o: dist.all_to_all_single(o, x, async_op=async_op)),
        ("all_gather", lambda o: dist.all_gather([o], x, async_op=async_op)),
        ("reduce_scatter", lambda o: dist.reduce_scatter(o, [x], async_op=async_op)),
        ("gather", lambda o: dist.gather(x, [o], dst=0, async_op=async_op)),
        ("scatter", lambda o: dist.scatter(o, [x], src=0, async_op=async_op)),
    ]:
        out = torch.zeros(NUMEL, device="cuda")
        finish(call(out), async_op)
        results[name] = (out, x)
    finish(dist.barrier(async_op=async_op), async_op)
    wrong = [name for name, (got, want) in results.items() if not torch.equal(got, want)]
    assert not wrong


def test_a_coalesced_block_and_a_self_exchange(group):
    a, b = data(), data(2.0)
    with dist._coalescing_manager(async_ops=True) as block:
        dist.all_reduce(a)
        dist.all_reduce(b)
    block.wait()
    sent, received = data(5.0), torch.zeros(NUMEL, device="cuda")
    ops = [dist.P2POp(dist.isend, sent, 0), dist.P2POp(dist.irecv, received, 0)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    torch.cuda.synchronize()
    assert torch.equal(a, data()) and torch.equal(b, data(2.0))
    assert torch.equal(received, data(5.0))


def test_a_graph_captured_right_after_eager_traffic_replays_with_new_data(group):
    """The watchdog keeps polling during the capture (default global capture mode): its queries
    must not invalidate it."""
    source, gathered = data(), torch.zeros(NUMEL, device="cuda")
    for _ in range(50):
        dist.all_reduce(data())  # eager traffic the watchdog is still looking at
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_gather_into_tensor(gathered, source)
        work = dist.all_to_all_single(gathered, gathered.clone(), async_op=True)
        work.wait()
    wrong = []
    for step in range(20):
        source.copy_(data(step))
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(gathered, data(step)):
            wrong.append(step)
    dist.all_reduce(source)  # eager again after the replays
    torch.cuda.synchronize()
    assert not wrong


def test_destroy_returns_while_a_graph_of_the_group_is_alive(group):
    x = data()
    graph = torch.cuda.CUDAGraph()
    dist.all_reduce(x)
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
    graph.replay()
    start = time.monotonic()
    dist.destroy_process_group()
    took = time.monotonic() - start
    del graph
    assert took < 30


def test_ops_appear_in_the_profiler_and_the_flight_recorder(group):
    x = data()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(NUMEL, device="cuda"), x, async_op=True).wait()
        torch.cuda.synchronize()
    names = {event.name for event in prof.events()}
    assert {"nccl_core:all_reduce", "nccl_core:_all_gather_base"} <= names, sorted(names)
    assert "record_param_comms" in names
    if not torch_nccl_core._C.flight_recorder_enabled():
        return  # torch >= 2.15 records nccl_core groups itself
    dump = pickle.loads(torch_nccl_core.dump_flight_recorder())
    profiled = [e["profiling_name"] for e in dump["entries"]][-2:]
    assert profiled == ["nccl:all_reduce", "nccl:_all_gather_base"]


def test_work_duration_with_timing(group, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    timed = dist.new_group([0], backend="nccl_core")
    x = torch.empty(64 << 20, device="cuda")
    work = dist.all_gather_into_tensor(torch.empty_like(x), x, group=timed, async_op=True)
    work.wait()
    torch.cuda.synchronize()
    assert work._get_duration() > 0


def test_bad_input_raises_and_leaves_the_group_usable(group):
    x = data()
    with pytest.raises(ValueError, match="contiguous"):
        dist.all_reduce(torch.ones(4, 4, device="cuda").t())
    with pytest.raises(ValueError, match="nccl_core"):
        dist.all_gather_into_tensor(torch.empty(NUMEL + 1, device="cuda"), x)
    with pytest.raises(TypeError, match="nccl_core"):
        dist.all_gather_into_tensor(torch.empty(NUMEL, device="cuda", dtype=torch.half), x)
    with pytest.raises(ValueError, match="BAND"):
        dist.all_reduce(torch.ones(4, device="cuda", dtype=torch.int32), op=dist.ReduceOp.BAND)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.equal(x, data())


@pytest.mark.parametrize("window", [False, True], ids=["nccl_memory", "window"])
def test_ops_on_nccl_memory_and_windows(group, window):
    """A symmetric window makes the group's window-free twin (a split, at one rank too).

    Small ops on window memory run on the twin, which registers their memory once; on plain NCCL
    memory they run on the group's communicator, which registers it there.
    """
    x = torch_nccl_core.empty(NUMEL, device="cuda", window=window)
    out = torch_nccl_core.empty(NUMEL, device="cuda", window=window)
    for _ in range(2):
        x.copy_(data())
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        dist.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    assert torch.equal(x, data()) and torch.equal(out, data())
    comm = torch_nccl_core.communicator(group)
    twin = group._get_backend(torch.device("cuda"))._window_free_twin
    assert (comm.find_window(x) is not None) == window
    # Two windows, or two automatic registrations: one per allocation, however many ops.
    assert comm._resource_count() == 2
    if window:
        assert twin is not None and twin._resource_count() == 2
    else:
        assert twin is None


def test_reinitialise_after_destroy_in_the_same_process(group):
    for _ in range(3):
        x = data()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.destroy_process_group()  # right after a synchronous op
        dist.init_process_group("nccl_core", store=dist.HashStore(), rank=0, world_size=1)
    x = data()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.equal(x, data())


@pytest.mark.parametrize("async_op", ASYNC, ids=["sync", "async"])
def test_nan_check_refuses_nan_to_send_and_leaves_the_group_usable(group, monkeypatch, async_op):
    monkeypatch.setenv("TORCH_NCCL_NAN_CHECK", "1")
    checked = dist.new_group([0], backend="nccl_core")
    dirty = data()
    dirty[7] = float("nan")
    with pytest.raises(ValueError, match="allreduce: tensor 0 to send holds NaN"):
        dist.all_reduce(dirty, group=checked, async_op=async_op)
    with pytest.raises(ValueError, match="allgather_into_tensor: tensor 0 to send holds NaN"):
        dist.all_gather_into_tensor(torch.empty_like(dirty), dirty, group=checked)
    x = data()
    finish(dist.all_reduce(x, group=checked, async_op=async_op), async_op)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no check while capturing: nothing may synchronize
        dist.all_reduce(dirty, group=checked)
    assert torch.equal(x, data())


def test_a_device_communicator_takes_each_kind_of_requirement(group):
    """create_dev_comm sets flags, counts and (NCCL >= 2.29) enums from DevCommRequirements, and
    names a requirement the NCCL it was built against lacks; the group stays usable."""
    comm = torch_nccl_core.communicator()
    requirements = torch_nccl_core.DevCommRequirements(
        lsa_multimem=False, barrier_count=1, lsa_barrier_count=2, gin_force_enable=False
    )
    try:
        dev = comm.create_dev_comm(requirements)
    except NotImplementedError as error:  # .ci/gpu_nccl's other NCCL, loaded without a rebuild
        if "the NCCL release this extension was built against" not in str(error):
            raise
        pytest.skip(str(error))
    assert (dev.is_valid, dev.lsa_rank, dev.lsa_size) == (True, 0, 1)
    dev.close()
    no_gin = torch_nccl_core.DevCommRequirements(
        gin_connection_type=torch_nccl_core.GinConnectionType.NONE
    )
    if torch_nccl_core.nccl_version() >= (2, 29, 0):
        comm.create_dev_comm(no_gin).close()
    else:
        with pytest.raises(NotImplementedError, match="requirement 'gin_connection_type'"):
            comm.create_dev_comm(no_gin)
    y = data()
    dist.all_reduce(y)
    torch.cuda.synchronize()
    assert torch.equal(y, data())

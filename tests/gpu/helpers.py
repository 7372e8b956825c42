"""Shared pieces of the GPU suite: per-rank data, local references, checks.

Every rank can build every other rank's data (it is a pure function of rank, shape, dtype and a
salt), so each test computes its expected result locally with plain torch ops and compares after
all of its collectives have run.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torch_nccl_core

# The suite runs at any world size (torchrun --nproc-per-node=N, one GPU per rank); a test that
# needs more ranks than the world has says so with needs_ranks.
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "2"))
SIZES = (0, 1, 1023, 4097, 1 << 20)
SWEEP_NUMEL = 1023  # the odd size at which dtype and op sweeps run
PREMUL_FACTOR = 0.5  # exact in every float dtype, and not the identity

INT_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.uint32, torch.int64, torch.uint64)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES
COMPLEX_DTYPES = (torch.complex64, torch.complex128)
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# dtypes that only move bytes: broadcast, all_gather, send/recv
COPY_DTYPES = (*NUMERIC_DTYPES, torch.bool, *COMPLEX_DTYPES, *FLOAT8_DTYPES)

REDUCE_OPS = ("sum", "product", "min", "max", "avg", "premul_sum_scalar", "premul_sum_tensor")
FLOAT_ONLY_OPS = frozenset({"avg", "premul_sum_scalar", "premul_sum_tensor"})

# torch cannot compare these elementwise on every build: compare their bytes instead
_BYTEWISE_DTYPES = frozenset({torch.uint16, torch.uint32, torch.uint64, *FLOAT8_DTYPES})

ASYNC_MODES = [pytest.param(False, id="sync"), pytest.param(True, id="async")]
# rooted collectives: the first and the last root and both modes, without the full cross product
ROOT_MODES = [
    pytest.param(0, False, id="root0-sync"),
    pytest.param(WORLD_SIZE - 1, True, id="rootlast-async"),
]


def local_device(local_rank: int | None = None) -> torch.device:
    """The GPU of a rank of this node: LOCAL_RANK % GPU count (ranks may share GPUs)."""
    if local_rank is None:
        local_rank = int(os.environ["LOCAL_RANK"])
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def ranks_share_gpus() -> bool:
    """Whether this machine's ranks put two on one GPU: they reach each other only through
    NCCL's network transport then, as nodes of their own, never by load/store."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", WORLD_SIZE)) > torch.cuda.device_count()


def load_store_reachable(group: dist.ProcessGroup | None = None) -> bool:
    """Whether every rank of `group` maps the others' memory (one NVLink or PCIe P2P domain).
    Where ranks share a GPU, as nodes of their own, or sit on other nodes, they do not: features
    that need it refuse clearly or leave the op to NCCL (the cross-node contract)."""
    comm = torch_nccl_core.communicator(group)
    return comm.lsa_size == comm.size


def window_refusal(group: dist.ProcessGroup | None = None) -> str | None:
    """None where NCCL gives the communicator of `group` windows; else the reason a window
    registration gives. NCCL >= 2.29 gives symmetric memory (windows, device communicators)
    across load/store teams only where GPU-initiated networking (GIN) reaches every rank, and
    says so in ncclCommQueryProperties: the test's premise, not the package's behaviour."""
    comm = torch_nccl_core.communicator(group)
    return None if comm.supports_windows else comm._no_window_reason()


def one_sided_refusal(group: dist.ProcessGroup | None = None) -> str | None:
    """None where one-sided ops reach every peer of `group`; else a pattern of the
    NotImplementedError they raise before anything is enqueued: peers that are not load/store
    reachable need NCCL's own one-sided API (NCCL >= 2.29)."""
    if load_store_reachable(group) or torch_nccl_core.one_sided_engine() == "nccl":
        return None
    return r"not load/store reachable.*NCCL >= 2\.29"


def one_sided_refused(call: Callable[[], object], group: dist.ProcessGroup | None = None) -> bool:
    """Where one-sided ops cannot reach the peers of `group` (other nodes, NCCL < 2.29), `call`
    must raise a clear NotImplementedError before anything is enqueued, and the group stays
    usable: True then (the caller has checked the cross-node contract and ends its test); False
    where one-sided ops can run. Collective: every rank decides alike."""
    refusal = one_sided_refusal(group)
    if refusal is None:
        return False
    assert_refused(call, NotImplementedError, refusal, group=group)
    return True


def needs_ranks(count: int) -> pytest.MarkDecorator:
    """Skips a test in a world of fewer than `count` ranks (on every rank alike)."""
    return pytest.mark.skipif(
        WORLD_SIZE < count, reason=f"needs {count} or more ranks, the world has {WORLD_SIZE}"
    )


def ring_peers(rank: int) -> tuple[int, int]:
    """(next, previous): the rank this one sends to in a ring and the one it receives from (the
    same rank in a world of two)."""
    return (rank + 1) % WORLD_SIZE, (rank - 1) % WORLD_SIZE


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_cases(dtypes: Sequence[torch.dtype]) -> list:
    """(dtype, numel) cases: every dtype at SWEEP_NUMEL, then every other size at float32."""
    cases = [pytest.param(dt, SWEEP_NUMEL, id=f"{dtype_id(dt)}-n{SWEEP_NUMEL}") for dt in dtypes]
    cases += [pytest.param(torch.float32, n, id=f"float32-n{n}") for n in SIZES if n != SWEEP_NUMEL]
    return cases


def reduce_cases() -> list:
    """(op, dtype, numel) cases: every valid op x dtype at SWEEP_NUMEL, then a size sweep."""
    cases = [
        pytest.param(op, dt, SWEEP_NUMEL, id=f"{op}-{dtype_id(dt)}-n{SWEEP_NUMEL}")
        for op in REDUCE_OPS
        for dt in NUMERIC_DTYPES
        if dt.is_floating_point or op not in FLOAT_ONLY_OPS
    ]
    cases += [
        pytest.param(op, dt, n, id=f"{op}-{dtype_id(dt)}-n{n}")
        for op, dt in (("sum", torch.float32), ("avg", torch.bfloat16))
        for n in SIZES
        if n != SWEEP_NUMEL
    ]
    return cases


def require_dtype(dtype: torch.dtype) -> None:
    """Skip float8 where the backend reports no support; the answer is the same on every rank."""
    if dtype in FLOAT8_DTYPES and not torch_nccl_core.features()["float8"]:
        pytest.skip("torch_nccl_core.features()['float8'] is False with this NCCL")


def rank_tensor(
    shape: int | Sequence[int], dtype: torch.dtype, rank: int, *, salt: int = 0
) -> torch.Tensor:
    """Data of `rank` on the current CUDA device, exact in `dtype`.

    Over two ranks values lie in 1..7 (-3..3 for signed dtypes); in larger worlds in 1..2 (-1 or
    1), so that every partial sum and product over all ranks stays exact in every dtype, float8
    included (float8_e5m2 holds the integers exactly only up to 8). Ranks and salts give
    different sequences, and the ranks disagree element by element on which one holds the minimum.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    index = torch.arange(math.prod(shape), dtype=torch.int64, device="cuda")
    wide = WORLD_SIZE <= 2
    values = (index * (2 * rank + 1) + 3 * rank + 5 * salt) % (7 if wide else 17)
    values = (values + 1 if wide else values % 2 + 1).reshape(shape)  # mod 17: 8 distinct ranks
    if dtype == torch.bool:
        return values % 2 == 0
    if dtype.is_complex:
        return torch.complex((values - 4).double(), (values * 3 % 7 - 3).double()).to(dtype)
    if dtype.is_signed:
        values = values - 4 if wide else values * 2 - 3
    if dtype.is_floating_point:
        return values.float().to(dtype)
    return values.to(dtype)


def all_ranks(shape: int | Sequence[int], dtype: torch.dtype, *, salt: int = 0) -> list:
    return [rank_tensor(shape, dtype, r, salt=salt) for r in range(WORLD_SIZE)]


def _wide_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.complex128
    if dtype.is_floating_point:
        return torch.float64 if dtype.itemsize >= 4 else torch.float32
    return torch.int64


def _widen(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(_wide_dtype(tensor.dtype))


def concat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.cat through a wide dtype (cat lacks kernels for some dtypes under test)."""
    return torch.cat([_widen(t) for t in tensors]).to(tensors[0].dtype)


def reference_reduce(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """What reducing `tensors` elementwise with `op` (a REDUCE_OPS name) must give."""
    stacked = torch.stack([_widen(t) for t in tensors])
    if op == "sum":
        result = stacked.sum(0)
    elif op == "product":
        result = stacked.prod(0)
    elif op == "min":
        result = stacked.amin(0)
    elif op == "max":
        result = stacked.amax(0)
    elif op == "avg":
        result = stacked.sum(0) / len(tensors)
    elif op.startswith("premul_sum"):
        result = stacked.sum(0) * PREMUL_FACTOR
    else:
        raise AssertionError(f"no reference for op {op!r}")
    return result.to(tensors[0].dtype)


def make_reduce_op(op: str, dtype: torch.dtype) -> dist.ReduceOp:
    if op == "premul_sum_scalar":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    if op == "premul_sum_tensor":
        factor = torch.tensor([PREMUL_FACTOR], dtype=dtype, device="cuda")
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op.upper())


def poisoned(expected: torch.Tensor) -> torch.Tensor:
    """An output buffer that differs from `expected` in every element.

    torch.empty could hand back a cached block that already holds the expected bytes (every
    test builds the same data), which would let a collective that wrote nothing pass.
    """
    if expected.dtype == torch.bool:
        return expected.logical_not()
    return (_widen(expected) + 1).to(expected.dtype)


def assert_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality of shape, dtype and values (every value in this suite is exact)."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.dtype in _BYTEWISE_DTYPES:
        actual = actual.contiguous().reshape(-1).view(torch.uint8)
        expected = expected.contiguous().reshape(-1).view(torch.uint8)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def profiled_kernels(call: Callable[[], object]) -> list[str]:
    """Names of the profiler events (GPU kernels included) while `call` runs to completion."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [event.name for event in prof.events()]


def new_core_group(**options: object) -> dist.ProcessGroup:
    """A new nccl_core group over every rank, with these torch_nccl_core.Options."""
    return dist.new_group(backend="nccl_core", pg_options=torch_nccl_core.Options(**options))


def owned_group(group: dist.ProcessGroup) -> Iterator[dist.ProcessGroup]:
    """The body of a fixture that owns `group`: `yield from` it to destroy the group after use."""
    yield group
    dist.destroy_process_group(group)


def complete(work: dist.Work | None, async_op: bool) -> None:
    """Finish a torch.distributed call: wait on its Work when async, expect none when sync."""
    if async_op:
        assert work is not None, "async_op=True must return a Work"
        work.wait()
    else:
        assert work is None, f"a sync call returned {work!r}"


def run_reduce_scatter(
    group: dist.ProcessGroup | None,
    numel: int,
    dtype: torch.dtype,
    rank: int,
    op: str = "sum",
    *,
    salt: int = 0,
    async_op: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs one reduce_scatter_tensor of `numel` output elements; returns (output, expected)."""
    inputs = all_ranks(numel * WORLD_SIZE, dtype, salt=salt)
    expected = reference_reduce(inputs, op)[rank * numel : (rank + 1) * numel]
    output = poisoned(expected)
    work = dist.reduce_scatter_tensor(
        output, inputs[rank], op=make_reduce_op(op, dtype), group=group, async_op=async_op
    )
    complete(work, async_op)
    return output, expected


def raised_by(call: Callable[[], object]) -> BaseException | None:
    """Run `call` and hand back what it raised, so a test can finish its collectives first."""
    try:
        call()
    except Exception as error:  # the caller asserts on the type
        return error
    return None


def assert_raised(
    error: BaseException | None,
    types: type[BaseException] | tuple[type[BaseException], ...],
    match: str | None = None,
) -> None:
    assert error is not None, f"expected {types} but the call returned normally"
    assert isinstance(error, types), f"expected {types}, got {type(error).__name__}: {error}"
    if match is not None:
        assert re.search(match, str(error)), f"message {str(error)!r} does not match {match!r}"


def window_free_twin(group: dist.ProcessGroup | None = None):
    """The communicator that runs ops NCCL's symmetric kernels would slow down (None before one)."""
    group = group or dist.group.WORLD
    return group._get_backend(torch.device("cuda"))._window_free_twin


def probe_group(group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one all_reduce on `group`; return (result, expected) for assert_equal afterwards.

    Used after a refused call to show the communicator still works; the comparison is left to
    the caller so that every collective of a test runs before any assertion can stop it.
    """
    members = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    tensor = rank_tensor(257, torch.float32, dist.get_rank())
    dist.all_reduce(tensor, group=group)
    return tensor, reference_reduce([rank_tensor(257, torch.float32, r) for r in members], "sum")


def assert_refused(
    call: Callable[[], object],
    types: type[BaseException] | tuple[type[BaseException], ...],
    match: str | None = None,
    group: dist.ProcessGroup | None = None,
) -> None:
    """`call` raises `types` (its message matching `match`) and `group` stays usable. Collective:
    every rank runs the probe before any assertion can stop it."""
    error = raised_by(call)
    probe = probe_group(group)
    assert_raised(error, types, match)
    assert_equal(*probe)


def register_close_cycles(
    comm: torch_nccl_core.Communicator, register: Callable, cycles: int
) -> dict[str, float]:
    """Registers 4 MiB of NCCL memory with `register` (comm.register_buffer or register_window)
    and closes it, `cycles` times after a warm-up; returns what that left behind (device bytes,
    file descriptors, resources) and the time a cycle took."""
    memory = torch_nccl_core.empty(1 << 20)
    for _ in range(20):  # NCCL's own first-use allocations
        register(memory).close()
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    fds_before, resources_before = len(os.listdir("/proc/self/fd")), comm._resource_count()
    start = time.perf_counter()
    for _ in range(cycles):
        register(memory).close()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    return {
        "cycles": cycles,
        "ms_per_cycle": seconds / cycles * 1e3,
        "device_bytes_lost": free_before - free_after,
        "fds_gained": len(os.listdir("/proc/self/fd")) - fds_before,
        "resources_gained": comm._resource_count() - resources_before,
    }


def _child_world_env(rank: int, world: int, port: int) -> dict[str, str]:
    """This rank's environment in a world of its own of `world` processes, bootstrapped over
    loopback."""
    launcher = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in launcher and not k.startswith("TORCHELASTIC")
    }
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        NCCL_SOCKET_IFNAME="lo",
    )
    return env


def _unused_port() -> int:
    """A loopback port free now and below the OS's ephemeral range, for a store that listens on
    it a moment later. A port the OS handed out (bind to 0) was taken in between, EADDRINUSE, by
    some socket of the worlds running beside this one: ports of the ephemeral range go to every
    socket bound to 0 (NCCL's listeners, each TCP client's own end); ports below it go only to
    sockets that name them."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        ephemeral = int(ports.read().split()[0])
    below = range(1024, ephemeral)  # above the ports only root may bind
    for port in random.sample(below, min(100, len(below))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {below} below the ephemeral range")


def run_child_world(
    rank: int,
    script: os.PathLike,
    args: Sequence[str],
    timeout_s: float,
    world: int = WORLD_SIZE,
    replace_killed: Sequence[str] = (),
) -> subprocess.CompletedProcess | None:
    """Runs `script` as this rank of a world of its own, of the suite's first `world` ranks
    (one child each, joined over loopback); a child still running after `timeout_s` is killed
    and reported as rc -9. None on the ranks outside that world. A child that SIGKILLed itself
    is followed, where `replace_killed` gives arguments, by a new one run with them in its
    place (as an elastic agent restarts a lost process): its result is the first child's
    `replacement`.

    Collective over the default group: every rank calls it with the same script, and returns
    once every child has ended (so no rank runs ahead into the next test's collectives)."""
    port = torch.zeros(1, dtype=torch.int64, device="cuda")
    if rank == 0:
        port.fill_(_unused_port())
    dist.broadcast(port, src=0)
    child = None
    if rank < world:
        env = _child_world_env(rank, world, int(port.item()))
        child = _run_with_stacks_on_timeout([str(script), *args], env, timeout_s)
        if replace_killed and child.returncode == -signal.SIGKILL:
            child.replacement = _run_with_stacks_on_timeout(
                [str(script), *replace_killed], env, timeout_s
            )
    dist.barrier()
    return child


# Runs a script as `python script args` would (its folder first on sys.path, not the working
# directory), with every thread's Python stack dumped on SIGUSR1.
_WITH_STACKS = (
    "import faulthandler, os, runpy, signal, sys; "
    "faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "sys.argv = sys.argv[1:]; sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0])); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _run_with_stacks_on_timeout(
    argv: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess:
    """Runs `python argv...` in a session of its own; one still running after `timeout_s` is
    killed with everything it started and reported as rc -9, with its threads' Python stacks
    (and native ones, where gdb is there) in its stderr."""
    command = [sys.executable, "-c", _WITH_STACKS, *argv]
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(command, process.returncode, out, err)
    except subprocess.TimeoutExpired:
        pass
    process.send_signal(signal.SIGUSR1)
    time.sleep(1.0)  # the dump, before gdb stops the process
    native = _native_stacks(process.pid) if process.poll() is None else ""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        out, err = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        out, err = "", "(its output was not readable after the kill)"
    return subprocess.CompletedProcess(command, -9, out, f"{native}\n{err}\n[killed: timed out]")


def _native_stacks(pid: int) -> str:
    """Every thread's native stack of process `pid`, where gdb is installed."""
    if shutil.which("gdb") is None:
        return "(no gdb: native stacks not taken)"
    try:
        done = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=15,
        )
    except subprocess.TimeoutExpired:
        return "(gdb timed out)"
    frames = [ln[:160] for ln in done.stdout.splitlines() if ln.startswith(("#", "Thread"))]
    return "native stacks:\n" + "\n".join(frames)

"""Package, registration and options: everything checkable without a GPU."""

import ctypes
import datetime
import importlib.metadata
import os

import pytest
import torch
import torch.distributed as dist

import torch_nccl_core
from torch_nccl_core import _C, _registration


def test_version_and_nccl_version():
    assert torch_nccl_core.__version__ == importlib.metadata.version("torch-nccl-core")
    version = torch_nccl_core.nccl_version()
    assert isinstance(version, tuple) and len(version) == 3
    assert version >= (2, 28, 0)
    # The headers the extension was built with are NCCL >= 2.28 too.
    assert _C.nccl_header_version() >= 22800
    # The library in the process (torch's, or another one preloaded: .ci/nccl_version), asked
    # directly; torch.cuda.nccl.version() may give the NCCL torch was built with instead.
    code = ctypes.c_int()
    assert ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(code)) == 0
    assert version == (code.value // 10000, code.value % 10000 // 100, code.value % 100)


def test_features_follow_the_runtime_version():
    features = torch_nccl_core.features()
    assert all(isinstance(v, bool) for v in features.values())
    version = torch_nccl_core.nccl_version()
    assert features["float8"] == (version >= (2, 24, 0))
    assert features["window_registration"] == (version >= (2, 27, 0))
    assert features["device_api"] == (version >= (2, 28, 0))
    assert features["host_one_sided"] == (version >= (2, 29, 0))


def test_backend_registered_for_cuda():
    assert "nccl_core" in dist.Backend.backend_list
    assert dist.Backend("nccl_core") == "nccl_core"
    assert dist.Backend.backend_capability["nccl_core"] == ["cuda"]
    assert dist.Backend.backend_type_map["nccl_core"] == dist.ProcessGroup.BackendType.CUSTOM


def test_register_is_idempotent():
    _registration.register()
    _registration.register()
    assert dist.Backend.backend_list.count("nccl_core") == 1


def test_entry_point_declared():
    eps = importlib.metadata.entry_points(group="torch.distributed.backends")
    (ep,) = [ep for ep in eps if ep.name == "nccl_core"]
    assert ep.load() is _registration.register


def test_options_defaults_and_round_trip():
    o = torch_nccl_core.Options()
    assert o.timeout is None and o.blocking is None and o.comm_name is None
    assert o.high_priority_stream is False and o.copy_engine_reduce_scatter is None
    assert o.all_reduce_kernels is None and o.register_caching_allocator is None
    assert o.gather_scatter_kernels is None
    o = torch_nccl_core.Options(
        timeout=datetime.timedelta(seconds=7),
        high_priority_stream=True,
        blocking=True,
        cga_cluster_size=4,
        min_ctas=2,
        max_ctas=16,
        net_name="Socket",
        split_share=True,
        comm_name="trainer",
        copy_engine_reduce_scatter=False,
        all_reduce_kernels="two_shot",
        gather_scatter_kernels=False,
        register_caching_allocator=True,
        cta_policy="efficiency",
    )
    assert o.timeout == datetime.timedelta(seconds=7)
    assert (o.blocking, o.cga_cluster_size, o.min_ctas, o.max_ctas) == (True, 4, 2, 16)
    assert (o.net_name, o.split_share, o.comm_name) == ("Socket", True, "trainer")
    assert o.copy_engine_reduce_scatter is False
    assert "copy_engine_reduce_scatter=False" in repr(o)
    assert o.all_reduce_kernels == "two_shot" and "all_reduce_kernels='two_shot'" in repr(o)
    assert o.gather_scatter_kernels is False and "gather_scatter_kernels=False" in repr(o)
    assert o.register_caching_allocator is True
    assert "register_caching_allocator=True" in repr(o)
    assert o.cta_policy == "efficiency" and "cta_policy='efficiency'" in repr(o)
    assert "comm_name='trainer'" in repr(o) and "high_priority_stream=True" in repr(o)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_ctas": 0}, "min_ctas must be in"),
        ({"max_ctas": 65}, "max_ctas must be in"),
        ({"min_ctas": 8, "max_ctas": 4}, "must not exceed"),
        ({"cga_cluster_size": 9}, "cga_cluster_size must be in"),
        ({"timeout": datetime.timedelta(seconds=-1)}, "timeout must be positive"),
        ({"cta_policy": "fast"}, "cta_policy must be 'default', 'efficiency' or 'zero'"),
        ({"all_reduce_kernels": "three_shot"}, "all_reduce_kernels .* must be 'auto', 'off'"),
    ],
)
def test_options_reject_out_of_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch_nccl_core.Options(**kwargs)


def test_a_bad_all_reduce_kernels_environment_fails_the_group(monkeypatch, tmp_path):
    """TORCH_NCCL_CORE_ALL_REDUCE_KERNELS is read where Options leave it unset: a name it does
    not know raises at the group's creation, naming the variable."""
    monkeypatch.setenv("TORCH_NCCL_CORE_ALL_REDUCE_KERNELS", "fastest")
    torch_nccl_core.Options()  # the variable is the group's business, not the options'
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    timeout = datetime.timedelta(seconds=5)

    def backend(**options):
        return _C.NcclCoreBackend(store, 0, 1, "g", torch_nccl_core.Options(**options), timeout)

    with pytest.raises(ValueError, match=r"TORCH_NCCL_CORE_ALL_REDUCE_KERNELS.*'fastest'"):
        backend()
    backend(all_reduce_kernels="off").shutdown()  # the option decides where it is set


@pytest.mark.parametrize("capturing", [False, True])
def test_the_all_reduce_table_goes_one_shot_two_shot_nccl(capturing):
    """The measured table, at each world size it holds: one-shot for the smallest sizes, then
    (maybe) two-shot, then NCCL, each a contiguous range; other world sizes all NCCL."""
    sizes = [1 << k for k in range(3, 25)]
    for ranks in range(2, 9):
        got = [_C._load_store_kernel("all_reduce", ranks, b, capturing) for b in sizes]
        order = [k for i, k in enumerate(got) if i == 0 or k != got[i - 1]]
        assert order in (
            ["one_shot", "two_shot", None],
            ["one_shot", None],
            ["two_shot", None],
            [None],
        ), (ranks, order)
        assert got[-1] is None  # 16 MiB: past the staging


@pytest.mark.parametrize("capturing", [False, True])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_the_gather_scatter_table_is_one_range_from_the_smallest(op, capturing):
    """all_gather and reduce_scatter: their kernel from the smallest size up to a limit within
    the staging, then NCCL; other world sizes all NCCL. A name the table lacks is refused."""
    sizes = [1 << k for k in range(3, 25)]
    for ranks in range(2, 9):
        got = [_C._load_store_kernel(op, ranks, b, capturing) for b in sizes]
        order = [k for i, k in enumerate(got) if i == 0 or k != got[i - 1]]
        assert order in ([op, None], [None]), (ranks, order)
    with pytest.raises(ValueError, match=r"op must be 'all_reduce'.*got 'broadcast'"):
        _C._load_store_kernel("broadcast", 2, 8, capturing)


def test_nonblocking_communicators_are_accepted():
    assert torch_nccl_core.Options(blocking=False).blocking is False


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        torch_nccl_core.Options(datetime.timedelta(seconds=1))


@pytest.fixture
def single_rank_group(tmp_path):
    """A one-rank default group on "cpu:gloo,cuda:nccl_core" (no GPU needed)."""
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    dist.init_process_group("cpu:gloo,cuda:nccl_core", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_init_process_group_creates_the_backend(single_rank_group):
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    assert isinstance(backend, _C.NcclCoreBackend)
    assert backend.supports_splitting
    assert backend.nccl_options.timeout is None
    # The CPU side of the mixed group is gloo and still works.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(3))


def test_pg_options_reach_the_backend(single_rank_group):
    options = torch_nccl_core.Options(comm_name="sub", max_ctas=4)
    group = dist.new_group([0], backend="nccl_core", pg_options=options)
    backend = group._get_backend(torch.device("cuda"))
    assert backend.nccl_options.comm_name == "sub" and backend.nccl_options.max_ctas == 4
    dist.destroy_process_group(group)


def test_pg_options_of_the_wrong_type_raise(single_rank_group):
    with pytest.raises(TypeError, match=r"torch_nccl_core\.Options"):
        dist.new_group([0], backend="nccl_core", pg_options=object())


def test_set_timeout_reaches_the_backend(single_rank_group):
    """The group's timeout follows set_timeout (dist.set_timeout in torch >= 2.14)."""
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    dist.group.WORLD.set_timeout(datetime.timedelta(seconds=7))
    assert backend.options._timeout == datetime.timedelta(seconds=7)
    with pytest.raises(ValueError, match="must be positive"):
        backend.set_timeout(datetime.timedelta(0))
    assert backend.options._timeout == datetime.timedelta(seconds=7)


@pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d.Backend, "register_abort_hook"),
    reason="c10d abort hooks need torch >= 2.14",
)
def test_abort_hooks_can_be_registered(single_rank_group):
    """torch's abort-hook API reaches the backend (the watchdog runs them: test_fake_nccl)."""
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    backend.register_abort_hook(7, lambda: None)
    backend.unregister_abort_hook(7)
    backend.unregister_abort_hook(7)  # an unknown id is no error
    if hasattr(backend, "supports_abort_hooks"):  # torch >= 2.15, a property
        assert backend.supports_abort_hooks is True


def test_backend_rejects_bad_rank(tmp_path):
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    with pytest.raises(ValueError, match="invalid rank 2 for size 2"):
        _C.NcclCoreBackend(
            store, 2, 2, "g", torch_nccl_core.Options(), datetime.timedelta(seconds=5)
        )


def test_shutdown_and_abort_without_communicator_are_idempotent(tmp_path):
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    backend = _C.NcclCoreBackend(
        store, 0, 1, "g", torch_nccl_core.Options(), datetime.timedelta(seconds=5)
    )
    backend.shutdown()
    backend.shutdown()
    backend.abort()


def test_group_options_copy_for_split_group(tmp_path):
    """split_group() deep-copies the parent backend's options (torch 2.11)."""
    import copy

    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    timeout = datetime.timedelta(seconds=5)
    backend = _C.NcclCoreBackend(store, 0, 1, "g", torch_nccl_core.Options(), timeout)
    options = backend.options
    assert isinstance(options, torch._C._distributed_c10d.Backend.Options)
    clone = copy.deepcopy(options)
    assert clone is not options
    assert clone.backend == "nccl_core" and clone._timeout == timeout
    backend.shutdown()


def test_op_without_tensors_and_without_a_gpu_raises(tmp_path):
    """A barrier on a group bound to no device, in a process that sees no GPU: a clear error."""
    if torch.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU")
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    backend = _C.NcclCoreBackend(
        store, 0, 1, "g", torch_nccl_core.Options(), datetime.timedelta(seconds=5), global_ranks=[3]
    )
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        backend.barrier()
    backend.shutdown()


def test_each_backend_on_a_store_is_a_new_incarnation(tmp_path):
    """Store keys carry how many backends this rank made on the store before, so a group
    re-created under the same name (re-init) never reads the previous one's keys."""
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    timeout = datetime.timedelta(seconds=5)
    for _ in range(3):
        _C.NcclCoreBackend(store, 0, 1, "g", torch_nccl_core.Options(), timeout).shutdown()
    assert store.add("nccl_core/incarnations/rank0", 0) == 3


def test_every_cta_policy_reaches_ncclconfig():
    for name in ("default", "efficiency", "zero"):
        assert torch_nccl_core.Options(cta_policy=name).cta_policy == name

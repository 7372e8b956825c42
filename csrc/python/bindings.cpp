// pybind11 module torch_nccl_core._C: the backend class, its options, and
// version / feature queries. Python code only adapts these to torch's API.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/backend.h"
#include "backend/engines/load_store_collectives.h"
#include "backend/ops/arguments.h"
#include "backend/runtime/flight_recorder.h"
#include "nccl/blocking_wait.h"
#include "nccl/errors.h"
#include "nccl/memory.h"
#include "nccl/version.h"
#include "python/communicator_bindings.h"
#include "python/registration_stats_dict.h"
#include "python/translate_errors.h"

namespace py = pybind11;

namespace nccl_core {
namespace {

std::string pyStr(bool value) {
  return value ? "True" : "False";
}
std::string pyStr(int value) {
  return std::to_string(value);
}

std::string repr(const NcclCoreOptions& o) {
  auto opt = [](const auto& value) {
    return value ? pyStr(*value) : std::string("None");
  };
  auto optStr = [](const std::optional<std::string>& value) {
    return value ? c10::str("'", *value, "'") : std::string("None");
  };
  return c10::str(
      "Options(timeout=",
      o.timeout ? c10::str(o.timeout->count(), " ms") : std::string("None"),
      ", high_priority_stream=",
      pyStr(o.highPriorityStream),
      ", blocking=",
      opt(o.blocking),
      ", cga_cluster_size=",
      opt(o.cgaClusterSize),
      ", min_ctas=",
      opt(o.minCtas),
      ", max_ctas=",
      opt(o.maxCtas),
      ", net_name=",
      optStr(o.netName),
      ", split_share=",
      opt(o.splitShare),
      ", comm_name=",
      optStr(o.commName),
      ", copy_engine_reduce_scatter=",
      opt(o.copyEngineReduceScatter),
      ", all_reduce_kernels=",
      optStr(o.allReduceKernels),
      ", gather_scatter_kernels=",
      opt(o.gatherScatterKernels),
      ", register_caching_allocator=",
      opt(o.registerCachingAllocator),
      ", window_upgrade=",
      opt(o.windowUpgrade),
      ", cta_policy=",
      optStr(o.ctaPolicy),
      ")");
}

constexpr const char* kOptionsDoc = R"(Options of an nccl_core process group.

Pass as ``pg_options`` to ``init_process_group`` / ``new_group``. Fields left
``None`` keep NCCL's defaults (and its ``NCCL_*`` environment variables;
``blocking`` also follows torch's ``TORCH_NCCL_USE_COMM_NONBLOCKING``).
``blocking=False``: initialization, splits and registrations are polled,
bounded by the timeout and abortable.
``copy_engine_reduce_scatter``: ``reduce_scatter_tensor`` through the copy
engine where every peer is load/store reachable; ``None`` follows
``TORCH_NCCL_CORE_COPY_ENGINE_REDUCE_SCATTER``, off where that is unset too
(alone it beats NCCL from 32 MiB of output, but an FSDP2 step measured
slower with it, docs/performance.md); ``True`` at every size, ``False``
never.
``all_reduce_kernels``: ``all_reduce`` in one kernel of this package's own
(one-shot or two-shot) where every peer is load/store reachable (sum,
product, min, max, avg; floating and integer dtypes; anything else goes to
NCCL): ``'auto'`` at the sizes where they were measured faster than NCCL at
the group's size, eagerly and in CUDA graphs (docs/performance.md),
``'off'`` never, ``'one_shot'`` or ``'two_shot'`` that kernel up to 8 MiB;
``None`` follows ``TORCH_NCCL_CORE_ALL_REDUCE_KERNELS`` (default ``'auto'``);
every rank of a group must ask the same. On, a group that routes any size to
them holds 8 MiB of staging per rank (and its signal window), made with its
communicator.
``gather_scatter_kernels``: ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` (sum, product, min, max, avg there) through the same
engine's one-shot kernels, where every peer is load/store reachable:
``None`` follows ``TORCH_NCCL_CORE_GATHER_SCATTER_KERNELS``, and where that is
unset too runs them at the sizes measured faster than NCCL at the group's
size (docs/performance.md); ``True`` up to 8 MiB (the larger tensor),
``False`` never. Every rank of a group must ask the same.
``register_caching_allocator``: ops on ordinary tensors register the segment
of torch's caching allocator they lie in with NCCL on first use, and torch's
free of the segment drops it; ``None`` follows
``TORCH_NCCL_CORE_REGISTER_ALLOCATOR`` (default off: on 2 GPUs it gained
nothing measurable, docs/performance.md).
``window_upgrade``: an ``all_reduce`` or ``reduce_scatter_tensor`` that runs
on the same buffers a third time, at sizes where NCCL's symmetric kernels
were measured faster, makes them symmetric windows if every rank can
(tensors of ``torch_nccl_core.empty``; all peers load/store reachable),
deciding together in the group's store, where that run waits for every
rank; for programs that pass the same buffers to those ops on every rank.
``None`` follows ``TORCH_NCCL_CORE_WINDOW_UPGRADE`` (default off).
``cta_policy``: NCCL's CTA policy, ``'default'``, ``'efficiency'`` or
``'zero'`` (all_gather and all_to_all on copy engines, no SMs, where NCCL can:
within a node, and across nodes from NCCL 2.30.7); ``None`` keeps NCCL's.)";

// Options(...): the fields as Python names them, validated.
std::shared_ptr<NcclCoreOptions> makeOptions(
    std::optional<std::chrono::milliseconds> timeout,
    bool highPriorityStream,
    std::optional<bool> blocking,
    std::optional<int> cgaClusterSize,
    std::optional<int> minCtas,
    std::optional<int> maxCtas,
    std::optional<std::string> netName,
    std::optional<bool> splitShare,
    std::optional<std::string> commName,
    std::optional<bool> copyEngineReduceScatter,
    std::optional<std::string> allReduceKernels,
    std::optional<bool> gatherScatterKernels,
    std::optional<bool> registerCachingAllocator,
    std::optional<bool> windowUpgrade,
    std::optional<std::string> ctaPolicy) {
  auto o = std::make_shared<NcclCoreOptions>();
  o->timeout = timeout;
  o->highPriorityStream = highPriorityStream;
  o->blocking = blocking;
  o->cgaClusterSize = cgaClusterSize;
  o->minCtas = minCtas;
  o->maxCtas = maxCtas;
  o->netName = std::move(netName);
  o->splitShare = splitShare;
  o->commName = std::move(commName);
  o->copyEngineReduceScatter = copyEngineReduceScatter;
  o->allReduceKernels = std::move(allReduceKernels);
  o->gatherScatterKernels = gatherScatterKernels;
  o->registerCachingAllocator = registerCachingAllocator;
  o->windowUpgrade = windowUpgrade;
  o->ctaPolicy = std::move(ctaPolicy);
  o->validate();
  return o;
}

void bindOptions(py::module_& m) {
  py::class_<NcclCoreOptions, std::shared_ptr<NcclCoreOptions>>(
      m, "Options", kOptionsDoc)
      .def(
          py::init(&makeOptions),
          py::kw_only(),
          py::arg("timeout") = py::none(),
          py::arg("high_priority_stream") = false,
          py::arg("blocking") = py::none(),
          py::arg("cga_cluster_size") = py::none(),
          py::arg("min_ctas") = py::none(),
          py::arg("max_ctas") = py::none(),
          py::arg("net_name") = py::none(),
          py::arg("split_share") = py::none(),
          py::arg("comm_name") = py::none(),
          py::arg("copy_engine_reduce_scatter") = py::none(),
          py::arg("all_reduce_kernels") = py::none(),
          py::arg("gather_scatter_kernels") = py::none(),
          py::arg("register_caching_allocator") = py::none(),
          py::arg("window_upgrade") = py::none(),
          py::arg("cta_policy") = py::none())
      .def_readwrite("timeout", &NcclCoreOptions::timeout)
      .def_readwrite(
          "high_priority_stream", &NcclCoreOptions::highPriorityStream)
      .def_readwrite("blocking", &NcclCoreOptions::blocking)
      .def_readwrite("cga_cluster_size", &NcclCoreOptions::cgaClusterSize)
      .def_readwrite("min_ctas", &NcclCoreOptions::minCtas)
      .def_readwrite("max_ctas", &NcclCoreOptions::maxCtas)
      .def_readwrite("net_name", &NcclCoreOptions::netName)
      .def_readwrite("split_share", &NcclCoreOptions::splitShare)
      .def_readwrite("comm_name", &NcclCoreOptions::commName)
      .def_readwrite(
          "copy_engine_reduce_scatter",
          &NcclCoreOptions::copyEngineReduceScatter)
      .def_readwrite("all_reduce_kernels", &NcclCoreOptions::allReduceKernels)
      .def_readwrite(
          "gather_scatter_kernels", &NcclCoreOptions::gatherScatterKernels)
      .def_readwrite(
          "register_caching_allocator",
          &NcclCoreOptions::registerCachingAllocator)
      .def_readwrite("window_upgrade", &NcclCoreOptions::windowUpgrade)
      .def_readwrite("cta_policy", &NcclCoreOptions::ctaPolicy)
      .def("__repr__", &repr);
}

void bindGroupOptions(py::module_& m) {
  // split_group() deep-copies the parent's options before handing them to
  // the child; torch's base Options class has no copy support of its own.
  py::class_<
      GroupOptions,
      c10d::Backend::Options,
      c10::intrusive_ptr<GroupOptions>>(
      m,
      "GroupOptions",
      "torch.distributed Backend.Options of an nccl_core group.")
      .def(
          "__copy__",
          [](const GroupOptions& o) {
            return c10::make_intrusive<GroupOptions>(o);
          })
      .def(
          "__deepcopy__",
          [](const GroupOptions& o, const py::dict&) {
            return c10::make_intrusive<GroupOptions>(o);
          },
          py::arg("memo"));
}

using BackendClass = py::
    class_<NcclCoreBackend, c10d::Backend, c10::intrusive_ptr<NcclCoreBackend>>;

// How a group's backend is made: by torch.distributed, or by growing a group.
void defineBackendMaking(BackendClass& backend) {
  backend
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store,
                      int rank,
                      int size,
                      std::string groupName,
                      const NcclCoreOptions& options,
                      std::chrono::milliseconds defaultTimeout,
                      std::vector<int64_t> globalRanks) {
            NCCL_CORE_CHECK_ARG(
                size > 0 && rank >= 0 && rank < size,
                "NcclCoreBackend",
                "invalid rank ",
                rank,
                " for size ",
                size);
            NCCL_CORE_CHECK_ARG(
                globalRanks.empty() ||
                    globalRanks.size() == static_cast<size_t>(size),
                "NcclCoreBackend",
                "global_ranks must name one global rank per rank of the "
                "group (",
                size,
                "), got ",
                globalRanks.size());
            return c10::make_intrusive<NcclCoreBackend>(
                Membership{store, rank, size, std::move(groupName)},
                std::make_shared<const NcclCoreOptions>(options),
                defaultTimeout,
                nullptr,
                std::move(globalRanks));
          }),
          py::arg("store"),
          py::arg("rank"),
          py::arg("size"),
          py::arg("group_name"),
          py::arg("options"),
          py::arg("default_timeout"),
          py::arg("global_ranks") = std::vector<int64_t>{})
      .def(
          "_grow",
          &NcclCoreBackend::grow,
          py::arg("store"),
          py::arg("size"),
          py::arg("group_name"),
          py::call_guard<py::gil_scoped_release>(),
          "This group's part in torch_nccl_core.grow_group.")
      .def_static(
          "_join",
          [](const c10::intrusive_ptr<c10d::Store>& store,
             int rank,
             int size,
             std::string groupName,
             const NcclCoreOptions& options,
             std::chrono::milliseconds timeout,
             int device) {
            return NcclCoreBackend::join(
                Membership{store, rank, size, std::move(groupName)},
                std::make_shared<const NcclCoreOptions>(options),
                timeout,
                device);
          },
          py::arg("store"),
          py::arg("rank"),
          py::arg("size"),
          py::arg("group_name"),
          py::arg("options"),
          py::arg("timeout"),
          py::arg("device"),
          py::call_guard<py::gil_scoped_release>(),
          "A new process's part in torch_nccl_core.grow_group.");
}

// What a group offers Python besides its ops.
void defineBackendApi(BackendClass& backend) {
  backend
      .def_property_readonly(
          "nccl_options",
          [](const NcclCoreBackend& b) { return NcclCoreOptions(b.options()); },
          "The torch_nccl_core.Options this group was created with.")
      .def_property_readonly(
          "options",
          [](NcclCoreBackend& b) { return b.getBackendOptions(); },
          "The group's torch.distributed options (timeout, group name).")
      // torch 2.11 calls this on the default group's backend on ranks outside
      // a new group. nccl_core creates new groups from their own unique id,
      // not by splitting the default one, so there is nothing to take part in.
      .def(
          "perform_nocolor_split",
          [](NcclCoreBackend&, const at::Device&) {},
          py::arg("device"))
      .def(
          "communicator",
          &NcclCoreBackend::sharedCommunicator,
          py::arg("device") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          "The group's NCCL communicator, created on first use.")
      .def(
          "register_mem_pool",
          &NcclCoreBackend::registerMemPool,
          py::arg("pool_id"),
          py::call_guard<py::gil_scoped_release>(),
          "Registers the segments memory pool `pool_id` "
          "(torch.cuda.MemPool.id) "
          "holds now with the group's communicator.")
      .def(
          "deregister_mem_pool",
          &NcclCoreBackend::deregisterMemPool,
          py::arg("pool_id"),
          py::call_guard<py::gil_scoped_release>(),
          "Drops what register_mem_pool registered.")
      .def(
          "registration_stats",
          [](NcclCoreBackend& b) {
            return registrationStatsDict(b.registrationStats());
          },
          "Registrations the group holds (on its communicator and its twin) "
          "and their bytes; registrations ops asked NCCL for on first use "
          "(refused ones included), and their time in seconds.")
      .def(
          "suspend",
          &NcclCoreBackend::suspendGroup,
          py::call_guard<py::gil_scoped_release>(),
          "Releases the memory NCCL holds for the group (NCCL >= 2.29.7); "
          "its ops are refused until resume().")
      .def(
          "resume",
          &NcclCoreBackend::resumeGroup,
          py::call_guard<py::gil_scoped_release>(),
          "Restores what suspend() released.")
      .def(
          "memory_stats",
          &NcclCoreBackend::groupMemoryStats,
          py::call_guard<py::gil_scoped_release>(),
          "NCCL's memory of the group in bytes: suspend (what suspend() "
          "releases), persist (what it keeps), total; suspended is 1 while "
          "suspended.")
      .def_property_readonly(
          "_window_free_twin",
          &NcclCoreBackend::windowFreeTwin,
          "The communicator that runs ops symmetric kernels would slow down "
          "(None before the first symmetric window).");
}

void bindBackend(py::module_& m) {
  BackendClass backend(
      m,
      "NcclCoreBackend",
      "The nccl_core c10d backend of one process group (one NCCL "
      "communicator).");
  defineBackendMaking(backend);
  defineBackendApi(backend);
}

} // namespace

// Runs a device-wide wait without the GIL where this thread holds it (and
// the interpreter is not finalizing, when releasing it could hang).
void withoutGil(void (*wait)(void*), void* arg) {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (Py_IsInitialized() && !finalizing && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    wait(arg);
  } else {
    wait(arg);
  }
}

void bindMemory(py::module_& m) {
  setBlockingWaitRunner(withoutGil);
  m.def(
      "empty",
      [](std::vector<int64_t> sizes,
         at::ScalarType dtype,
         c10::DeviceIndex device,
         bool columnMajor) {
        return emptyTensor(sizes, dtype, device, columnMajor);
      },
      py::arg("sizes"),
      py::arg("dtype"),
      py::arg("device"),
      py::arg("column_major"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "resolve_tensor",
      [](const at::Tensor& tensor) {
        constexpr const char* kOp = "resolve_tensor";
        NCCL_CORE_CHECK_ARG(
            tensor.is_cuda(),
            "resolve_tensor",
            "expected a CUDA tensor, got one on ",
            tensor.device());
        checkTensor(tensor, tensor.device().index(), kOp, "tensor");
        const NcclBuffer buf = bufferOf(tensor, kOp);
        return py::make_tuple(
            reinterpret_cast<uintptr_t>(buf.ptr),
            buf.count,
            static_cast<int>(buf.dtype),
            static_cast<int>(tensor.device().index()));
      },
      py::arg("tensor"));
}

PYBIND11_MODULE(_C, m) {
  // The c10d classes this module derives from and takes as arguments.
  py::module_::import("torch.distributed");
  py::register_local_exception_translator(&translateErrors);
  bindOptions(m);
  bindMemory(m);
  bindCommunicator(m);
  bindOneSided(m);
  bindGroupOptions(m);
  bindBackend(m);
  m.def(
      "nccl_version",
      [] {
        const auto& v = runtimeVersion();
        return py::make_tuple(v.major, v.minor, v.patch);
      },
      "(major, minor, patch) of the NCCL library loaded at run time.");
  m.def(
      "nccl_header_version",
      [] { return NCCL_VERSION_CODE; },
      "NCCL_VERSION_CODE this extension was built with.");
  m.def(
      "features",
      &featureMap,
      "What the loaded NCCL supports, by feature name.");
  m.def(
      "_load_store_kernel",
      [](const std::string& op, int ranks, size_t bytes, bool capturing)
          -> std::optional<std::string> {
        constexpr std::pair<const char*, c10d::OpType> kOps[] = {
            {"all_reduce", c10d::OpType::ALLREDUCE},
            {"all_gather", c10d::OpType::_ALLGATHER_BASE},
            {"reduce_scatter", c10d::OpType::_REDUCE_SCATTER_BASE}};
        constexpr const char* kNames[] = {
            "one_shot", "two_shot", "all_gather", "reduce_scatter"};
        for (const auto& [name, type] : kOps) {
          if (op == name) {
            const auto kernel =
                KernelChoice::measured(ranks, capturing).kernelFor(type, bytes);
            if (!kernel) {
              return std::nullopt;
            }
            return kNames[static_cast<int>(*kernel)];
          }
        }
        throw py::value_error(
            "op must be 'all_reduce', 'all_gather' or 'reduce_scatter', "
            "got '" +
            op + "'");
      },
      py::arg("op"),
      py::arg("ranks"),
      py::arg("bytes"),
      py::arg("capturing"),
      "The kernel the measured table gives `op` (its larger tensor holding "
      "`bytes`) in a group of `ranks` where every peer is load/store "
      "reachable ('one_shot', 'two_shot', 'all_gather', 'reduce_scatter'), "
      "or None (NCCL).");
  m.def(
      "dump_flight_recorder",
      [](bool onlyActive) {
        return py::bytes(FlightRecorder::process().dump(onlyActive));
      },
      py::arg("only_active") = false,
      "The flight recorder's dump (torch's pickled format).");
  m.def(
      "flight_recorder_enabled",
      [] { return FlightRecorder::process().enabled(); },
      "Whether nccl_core records its groups' ops itself.");
}

} // namespace nccl_core

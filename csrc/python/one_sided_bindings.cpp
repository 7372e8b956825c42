// pybind11: the one-sided methods of torch_nccl_core.Communicator (nccl4py's
// Communicator.put_signal / signal / wait_signal) and WaitSignalDesc.
// Arguments are checked here, before any NCCL call.
#include <type_traits>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/cuda/CUDAStream.h>

#include "backend/ops/arguments.h"
#include "nccl/capabilities.h"
#include "nccl/communicator.h"
#include "nccl/dev_comm.h"
#include "nccl/errors.h"
#include "nccl/one_sided.h"
#include "python/communicator_bindings.h"

namespace py = pybind11;

namespace nccl_core {

namespace {

// A stream handle given by the caller, checked to belong to `device`. A
// handle that is no live stream at all cannot be told from one by CUDA.
cudaStream_t onDevice(cudaStream_t stream, int device) {
  // The legacy and per-thread default streams are the current device's; the
  // op runs under a guard of the communicator's device.
  if (stream == nullptr || stream == cudaStreamLegacy ||
      stream == cudaStreamPerThread) {
    return stream;
  }
  int owner = -1;
  const cudaError_t result = cudaStreamGetDevice(stream, &owner);
  if (result != cudaSuccess) {
    (void)cudaGetLastError();
    NCCL_CORE_CHECK_ARG(
        false,
        "one-sided",
        "the stream handle is not a CUDA stream (",
        cudaGetErrorString(result),
        ")");
  }
  NCCL_CORE_CHECK_ARG(
      owner == device,
      "one-sided",
      "the stream belongs to cuda:",
      owner,
      " but the communicator uses cuda:",
      device);
  return stream;
}

// None (the current stream), a torch.cuda.Stream, an object with
// __cuda_stream__, or a raw cudaStream_t as an int.
cudaStream_t streamOf(const py::object& stream, int device) {
  if (stream.is_none()) {
    return c10::cuda::getCurrentCUDAStream(
               static_cast<c10::DeviceIndex>(device))
        .stream();
  }
  if (py::hasattr(stream, "cuda_stream")) {
    return onDevice(
        reinterpret_cast<cudaStream_t>(
            stream.attr("cuda_stream").cast<uintptr_t>()),
        device);
  }
  if (py::hasattr(stream, "__cuda_stream__")) {
    const auto protocol = stream.attr("__cuda_stream__")().cast<py::tuple>();
    return onDevice(
        reinterpret_cast<cudaStream_t>(protocol[1].cast<uintptr_t>()), device);
  }
  NCCL_CORE_CHECK_ARG_TYPE(
      py::isinstance<py::int_>(stream),
      "one-sided",
      "stream must be None, a torch.cuda.Stream, an "
      "object with __cuda_stream__ or a stream handle (int), got ",
      py::str(py::type::of(stream)).cast<std::string>());
  return onDevice(
      reinterpret_cast<cudaStream_t>(stream.cast<uintptr_t>()), device);
}

void checkReserved(int signalIndex, int context, int flags, const char* op) {
  NCCL_CORE_CHECK_ARG(
      signalIndex == 0 && context == 0 && flags == 0,
      op,
      "signal_index, context and flags must be 0 (NCCL reserves them), got ",
      signalIndex,
      ", ",
      context,
      " and ",
      flags);
}

void putSignalChecked(
    Communicator& comm,
    const at::Tensor& src,
    int peer,
    const Window& window,
    int64_t offset,
    int signalIndex,
    int context,
    int flags,
    const py::object& stream) {
  constexpr const char* kOp = "put_signal";
  checkReserved(signalIndex, context, flags, kOp);
  const PutSignal put =
      checkedPutSignal(comm, src, {window, peer, offset}, kOp);
  const cudaStream_t cudaStream = streamOf(stream, comm.device());
  py::gil_scoped_release noGil;
  putSignal(comm, put, cudaStream);
}

std::vector<WaitSignalDesc> descsOf(const py::object& descs) {
  if (py::isinstance<WaitSignalDesc>(descs)) {
    return {descs.cast<WaitSignalDesc>()};
  }
  NCCL_CORE_CHECK_ARG_TYPE(
      py::isinstance<py::sequence>(descs),
      "wait_signal",
      "expected a WaitSignalDesc or a sequence of them");
  return descs.cast<std::vector<WaitSignalDesc>>();
}

py::object ginTypeOf(int value) {
  return py::module_::import("torch_nccl_core.dev_comm").attr("GinType")(value);
}

// Property `name` of a communicator: `field` of what NCCL says of it, GIN
// types as dev_comm.GinType.
template <auto field>
auto capability(const char* name) {
  return [name](Communicator& comm) {
    const auto value = queryCapabilities(comm, name).*field;
    if constexpr (std::is_same_v<std::remove_const_t<decltype(value)>, bool>) {
      return value;
    } else {
      return ginTypeOf(value);
    }
  };
}

// DevComm and WaitSignalDesc.
void bindOneSidedTypes(py::module_& m) {
  py::class_<DevComm, CommResource, std::shared_ptr<DevComm>>(
      m, "DevComm", "A device communicator (ncclDevComm) of a communicator.")
      .def_property_readonly("ptr", &DevComm::ptr)
      .def_property_readonly("lsa_rank", &DevComm::lsaRank)
      .def_property_readonly("lsa_size", &DevComm::lsaSize);

  py::class_<WaitSignalDesc>(
      m, "WaitSignalDesc", "Wait for op_count signals from peer.")
      .def(
          py::init([](int peer, int64_t opCount, int signalIndex, int context) {
            return WaitSignalDesc{
                peer,
                checkedOpCount(opCount, "WaitSignalDesc"),
                signalIndex,
                context};
          }),
          py::arg("peer"),
          py::arg("op_count") = 1,
          py::arg("signal_index") = 0,
          py::arg("context") = 0)
      .def_readonly("peer", &WaitSignalDesc::peer)
      .def_readonly("op_count", &WaitSignalDesc::opCount)
      .def_readonly("signal_index", &WaitSignalDesc::signalIndex)
      .def_readonly("context", &WaitSignalDesc::context);
}

using CommunicatorClass =
    py::class_<Communicator, std::shared_ptr<Communicator>>;

// Communicator's one-sided methods: put_signal, signal, wait_signal.
void bindSignals(CommunicatorClass& cls) {
  cls.def(
         "put_signal",
         &putSignalChecked,
         py::arg("src"),
         py::arg("peer"),
         py::arg("window"),
         py::arg("offset") = 0,
         py::arg("signal_index") = 0,
         py::arg("context") = 0,
         py::arg("flags") = 0,
         py::kw_only(),
         py::arg("stream") = py::none(),
         "Copies src into peer's part of window at offset (in elements of "
         "src) and raises one signal at peer.")
      .def(
          "signal",
          [](Communicator& comm,
             int peer,
             int signalIndex,
             int context,
             int flags,
             const py::object& stream) {
            checkPeer(comm, peer, "signal");
            checkReserved(signalIndex, context, flags, "signal");
            const cudaStream_t cudaStream = streamOf(stream, comm.device());
            py::gil_scoped_release noGil;
            signal(comm, peer, cudaStream);
          },
          py::arg("peer"),
          py::arg("signal_index") = 0,
          py::arg("context") = 0,
          py::arg("flags") = 0,
          py::kw_only(),
          py::arg("stream") = py::none())
      .def(
          "wait_signal",
          [](Communicator& comm,
             const py::object& descs,
             const py::object& stream) {
            const std::vector<WaitSignalDesc> list = descsOf(descs);
            NCCL_CORE_CHECK_ARG(!list.empty(), "wait_signal", "no descriptors");
            for (const auto& d : list) {
              checkPeer(comm, d.peer, "wait_signal");
              checkReserved(d.signalIndex, d.context, 0, "wait_signal");
            }
            const cudaStream_t cudaStream = streamOf(stream, comm.device());
            py::gil_scoped_release noGil;
            waitSignal(comm, list, cudaStream);
          },
          py::arg("descs"),
          py::kw_only(),
          py::arg("stream") = py::none());
}

// Communicator's device communicators and what NCCL gave it.
void bindDeviceSupport(CommunicatorClass& cls) {
  cls.def(
         "create_dev_comm",
         [](Communicator& comm, const py::object& requirements) {
           std::map<std::string, int64_t> fields;
           if (!requirements.is_none()) {
             NCCL_CORE_CHECK_ARG_TYPE(
                 py::hasattr(requirements, "_nccl_fields"),
                 "create_dev_comm",
                 "requirements must be a "
                 "torch_nccl_core.DevCommRequirements or None");
             fields = requirements.attr("_nccl_fields")()
                          .cast<std::map<std::string, int64_t>>();
           }
           py::gil_scoped_release noGil;
           return createDevComm(comm, fields);
         },
         py::arg("requirements") = py::none(),
         "Creates a device communicator (collective).")
      .def_property_readonly(
          "gin_type", capability<&CommCapabilities::ginType>("gin_type"))
      .def_property_readonly(
          "railed_gin_type",
          capability<&CommCapabilities::railedGinType>("railed_gin_type"))
      .def_property_readonly(
          "device_api_support",
          capability<&CommCapabilities::deviceApi>("device_api_support"),
          "Whether NCCL gave the communicator symmetric memory: windows and "
          "device communicators (ncclCommQueryProperties, NCCL >= 2.29).")
      .def_property_readonly(
          "host_rma_support",
          capability<&CommCapabilities::hostRma>("host_rma_support"),
          "Whether NCCL's host one-sided API (ncclPutSignal) reaches every "
          "peer (ncclCommQueryProperties, NCCL >= 2.29.7).")
      .def_property_readonly(
          "supports_windows",
          &supportsWindows,
          "Whether NCCL gave the communicator symmetric memory, which windows "
          "need from NCCL 2.29 on (ranks load/store reachable, or GIN reaching "
          "them; register_window gives None elsewhere); True before 2.29.")
      .def("_no_window_reason", &noWindowReason);
}

} // namespace

void bindOneSided(py::module_& m) {
  bindOneSidedTypes(m);
  auto cls = py::reinterpret_borrow<CommunicatorClass>(m.attr("Communicator"));
  bindSignals(cls);
  bindDeviceSupport(cls);
  m.def("one_sided_engine", [] {
    return oneSidedEngine() == OneSidedEngine::Host ? "nccl" : "load_store";
  });
}

} // namespace nccl_core

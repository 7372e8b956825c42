// The nccl_core torch op library: one-sided operations taking the process
// group by name (like torch's _c10d_functional ops), so that they run from
// C++ and Python, are captured in CUDA graphs, and trace under torch.compile.
// Their schemas are functional, so that torch.compile's functionalization
// hands them the window itself (a mutated argument would be a copy under
// aot_eager): `window` names the window and is only read here; what a wait
// receives is returned (a copy of the window once the signals came), so code
// that reads it is ordered after the wait by its data. Python registers the
// ops as effectful (torch_nccl_core/ops.py): compiled graphs keep them, in
// program order.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/library.h>

#include "backend/backend.h"
#include "backend/ops/arguments.h"
#include "nccl/errors.h"
#include "nccl/one_sided.h"

namespace nccl_core {

namespace {

// Held for the op's duration, whatever happens to the group meanwhile.
std::shared_ptr<Communicator>
communicatorOf(const std::string& groupName, const char* op) {
  const auto group = c10d::resolve_process_group(groupName);
  auto backend = group->getBackend(c10::DeviceType::CUDA);
  auto* core = dynamic_cast<NcclCoreBackend*>(backend.get());
  NCCL_CORE_CHECK_ARG(
      core != nullptr,
      op,
      "group '",
      groupName,
      "' does not run nccl_core on CUDA");
  try {
    return core->sharedCommunicator(std::nullopt);
  } catch (const c10::DistBackendError& e) {
    // The group failed: say which op met it.
    C10_THROW_ERROR(
        DistBackendError,
        c10::str("nccl_core ", op, " on group '", groupName, "': ", e.msg()));
  }
}

std::shared_ptr<Window>
windowOf(Communicator& comm, const at::Tensor& window, const char* op) {
  auto found = comm.findWindow(window.data_ptr(), window.nbytes());
  NCCL_CORE_CHECK_ARG(
      found != nullptr,
      op,
      "`window` must be memory registered as a window of the group "
      "(torch_nccl_core.empty(..., window=True) or register_window); under "
      "torch.compile(mode=\"reduce-overhead\") mark it with "
      "torch._dynamo.mark_static_address, or CUDA graphs take a copy of it");
  return found;
}

cudaStream_t currentStream(const Communicator& comm) {
  return c10::cuda::getCurrentCUDAStream(
             static_cast<c10::DeviceIndex>(comm.device()))
      .stream();
}

void putSignalOp(
    const at::Tensor& src,
    const at::Tensor& window,
    int64_t peer,
    int64_t offset,
    c10::string_view groupName) {
  constexpr const char* kOp = "put_signal";
  const auto owner = communicatorOf(std::string(groupName), kOp);
  Communicator& comm = *owner;
  checkPeer(comm, peer, kOp);
  const auto win = windowOf(comm, window, kOp);
  putSignal(
      comm,
      checkedPutSignal(comm, src, {*win, peer, offset}, kOp),
      currentStream(comm));
}

void signalOp(
    const at::Tensor& window,
    int64_t peer,
    c10::string_view groupName) {
  const auto owner = communicatorOf(std::string(groupName), "signal");
  Communicator& comm = *owner;
  checkPeer(comm, peer, "signal");
  windowOf(comm, window, "signal");
  signal(comm, static_cast<int>(peer), currentStream(comm));
}

at::Tensor waitSignalOp(
    const at::Tensor& window,
    at::IntArrayRef peers,
    at::IntArrayRef opCounts,
    c10::string_view groupName) {
  constexpr const char* kOp = "wait_signal";
  const auto owner = communicatorOf(std::string(groupName), kOp);
  Communicator& comm = *owner;
  NCCL_CORE_CHECK_ARG(
      !peers.empty() && peers.size() == opCounts.size(),
      kOp,
      "expected as many op_counts as peers (at least one), got ",
      peers.size(),
      " and ",
      opCounts.size());
  windowOf(comm, window, kOp);
  std::vector<WaitSignalDesc> descs;
  for (size_t i = 0; i < peers.size(); ++i) {
    checkPeer(comm, peers[i], kOp);
    descs.push_back(
        {static_cast<int>(peers[i]), checkedOpCount(opCounts[i], kOp), 0, 0});
  }
  waitSignal(comm, descs, currentStream(comm));
  return window.clone(); // on the current stream, after the wait
}

// Fake (Meta) kernels: a wait returns a tensor like its window.
void putSignalMeta(
    const at::Tensor&,
    const at::Tensor&,
    int64_t,
    int64_t,
    c10::string_view) {}
void signalMeta(const at::Tensor&, int64_t, c10::string_view) {}
at::Tensor waitSignalMeta(
    const at::Tensor& window,
    at::IntArrayRef,
    at::IntArrayRef,
    c10::string_view) {
  return at::empty_like(window);
}

} // namespace

TORCH_LIBRARY(nccl_core, m) {
  m.def(
      "put_signal(Tensor src, Tensor window, int peer, int offset, "
      "str group_name) -> ()");
  m.def("signal(Tensor window, int peer, str group_name) -> ()");
  m.def(
      "wait_signal(Tensor window, int[] peers, int[] op_counts, "
      "str group_name) -> Tensor");
}

TORCH_LIBRARY_IMPL(nccl_core, CUDA, m) {
  m.impl("put_signal", putSignalOp);
  m.impl("signal", signalOp);
  m.impl("wait_signal", waitSignalOp);
}

TORCH_LIBRARY_IMPL(nccl_core, Meta, m) {
  m.impl("put_signal", putSignalMeta);
  m.impl("signal", signalMeta);
  m.impl("wait_signal", waitSignalMeta);
}

} // namespace nccl_core

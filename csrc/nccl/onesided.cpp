#include "nccl/onesided.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/env.h>
#include <dlfcn.h>

#include <atomic>
#include <limits>

#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

// NCCL >= 2.29's host API, looked up at run time (the extension links only
// NCCL 2.28 symbols).
struct HostApi {
  using PutSignalFn = ncclResult_t (*)(
      const void*,
      size_t,
      ncclDataType_t,
      int,
      ncclWindow_t,
      size_t,
      int,
      int,
      unsigned int,
      ncclComm_t,
      cudaStream_t);
  using SignalFn =
      ncclResult_t (*)(int, int, int, unsigned int, ncclComm_t, cudaStream_t);
  // ncclWaitSignalDesc_t: {opCnt, peer, sigIdx, ctx}.
  struct Desc {
    int opCnt;
    int peer;
    int sigIdx;
    int ctx;
  };
  using WaitSignalFn = ncclResult_t (*)(int, Desc*, ncclComm_t, cudaStream_t);

  PutSignalFn putSignal = nullptr;
  SignalFn signal = nullptr;
  WaitSignalFn waitSignal = nullptr;

  bool available() const {
    return putSignal != nullptr && signal != nullptr && waitSignal != nullptr;
  }
};

const HostApi& hostApi() {
  static const HostApi api = [] {
    HostApi found;
    if (hasFeature(Feature::HostOneSided)) {
      found.putSignal = reinterpret_cast<HostApi::PutSignalFn>(
          dlsym(RTLD_DEFAULT, "ncclPutSignal"));
      found.signal = reinterpret_cast<HostApi::SignalFn>(
          dlsym(RTLD_DEFAULT, "ncclSignal"));
      found.waitSignal = reinterpret_cast<HostApi::WaitSignalFn>(
          dlsym(RTLD_DEFAULT, "ncclWaitSignal"));
    }
    return found;
  }();
  return api;
}

// The LSA rank of `peer`, or NotImplementedError saying what would reach it.
int loadStorePeer(Communicator& comm, int peer, const char* otherwise) {
  const std::optional<int> lsaRank = lsaRankOf(comm, peer);
  TORCH_CHECK_NOT_IMPLEMENTED(
      lsaRank.has_value(),
      "nccl_core one-sided: peer ",
      peer,
      " is not load/store reachable from this rank (no NVLink or PCIe P2P "
      "mapping); ",
      otherwise);
  return *lsaRank;
}

constexpr const char* kNeedsHostApi =
    "one-sided operations to it need NCCL >= 2.29";

// The copy engine writes `src` straight into `peer`'s part of `window`
// through this rank's mapping of it; no SM is used.
void copyToPeer(
    Communicator& comm,
    const void* src,
    size_t bytes,
    int peer,
    const Window& window,
    size_t offsetBytes,
    const char* otherwise,
    cudaStream_t stream) {
  const int lsaRank = loadStorePeer(comm, peer, otherwise);
  const uintptr_t base =
      window
          .lsaBases(
              [&] { return lsaBases(comm, window.get(), lsaTeam(comm).size); })
          .at(lsaRank);
  C10_CUDA_CHECK(cudaMemcpyAsync(
      reinterpret_cast<void*>(base + offsetBytes),
      src,
      bytes,
      cudaMemcpyDeviceToDevice,
      stream));
}

SignalWindow& signalWindowOf(Communicator& comm) {
  SignalWindow* window = comm.signalWindow();
  TORCH_CHECK(
      window != nullptr,
      "nccl_core one-sided: register a window on this communicator first (its "
      "registration also sets up the signals)");
  return *window;
}

} // namespace

void checkPeer(const Communicator& comm, int64_t peer, const char* op) {
  TORCH_CHECK_VALUE(
      peer >= 0 && peer < comm.size() && peer != comm.rank(),
      "nccl_core ",
      op,
      ": peer must be another rank of the group, 0 <= peer < ",
      comm.size(),
      " and != ",
      comm.rank(),
      ", got ",
      peer);
}

int checkedOpCount(int64_t count, const char* op) {
  TORCH_CHECK_VALUE(
      count >= 1 && count <= std::numeric_limits<int>::max(),
      "nccl_core ",
      op,
      ": op_count must be in [1, 2**31 - 1], got ",
      count);
  return static_cast<int>(count);
}

size_t checkedOffsetBytes(
    int64_t offset,
    size_t bytes,
    size_t elementSize,
    size_t windowBytes,
    const char* op) {
  TORCH_CHECK_VALUE(
      offset >= 0 && bytes <= windowBytes &&
          static_cast<uint64_t>(offset) <= (windowBytes - bytes) / elementSize,
      "nccl_core ",
      op,
      ": ",
      bytes,
      " bytes at element offset ",
      offset,
      " do not fit in the window (",
      windowBytes,
      " bytes); expected 0 <= offset and offset * element size + bytes <= "
      "window size");
  return static_cast<size_t>(offset) * elementSize;
}

OneSidedEngine oneSidedEngine() {
  static const OneSidedEngine engine = [] {
    const auto value = c10::utils::get_env("TORCH_NCCL_CORE_ONE_SIDED_ENGINE");
    const std::string choice = value.value_or("auto");
    TORCH_CHECK_VALUE(
        choice == "auto" || choice == "nccl" || choice == "load_store",
        "TORCH_NCCL_CORE_ONE_SIDED_ENGINE must be auto, nccl or load_store, "
        "got '",
        choice,
        "'");
    if (choice == "load_store") {
      return OneSidedEngine::LoadStore;
    }
    const bool host = hostApi().available();
    TORCH_CHECK_NOT_IMPLEMENTED(
        host || choice == "auto",
        "TORCH_NCCL_CORE_ONE_SIDED_ENGINE=nccl needs NCCL >= 2.29 at run time "
        "(ncclPutSignal)");
    return host ? OneSidedEngine::Host : OneSidedEngine::LoadStore;
  }();
  return engine;
}

void SignalWindow::HostFree::operator()(int* flag) const noexcept {
  C10_CUDA_CHECK_WARN(cudaFreeHost(flag));
}

namespace {
int* mappedFlag() {
  int* flag = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(
      reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped));
  *flag = 0;
  return flag;
}
} // namespace

SignalWindow::SignalWindow(Communicator& comm)
    : abortFlag_(mappedFlag()),
      counters_(comm, 2 * kSignalChannels * sizeof(uint64_t) * comm.size()),
      self_(comm.rank()),
      size_(comm.size()) {
  C10_CUDA_CHECK(cudaHostGetDevicePointer(
      reinterpret_cast<void**>(&abortFlagOnDevice_), abortFlag_.get(), 0));
}

uint64_t* SignalWindow::counters(int index) const {
  return static_cast<uint64_t*>(counters_.local()) +
         static_cast<size_t>(index) * size_;
}

uint64_t* SignalWindow::remoteCounter(int peer, SignalChannel channel) const {
  const size_t offset = static_cast<size_t>(channel) * size_ + self_;
  return reinterpret_cast<uint64_t*>(counters_.remote(peer)) + offset;
}

uint64_t* SignalWindow::inbox(SignalChannel channel) const {
  return counters(static_cast<int>(channel));
}

uint64_t* SignalWindow::consumed(SignalChannel channel) const {
  return counters(kSignalChannels + static_cast<int>(channel));
}

const int* SignalWindow::abortFlag() const {
  return abortFlagOnDevice_;
}

void SignalWindow::waitAllPeers(
    SignalChannel channel,
    int count,
    cudaStream_t stream) const {
  std::vector<WaitSignalDesc> descs;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != self_) {
      descs.push_back({peer, count});
    }
  }
  detail::launchWait(
      inbox(channel), consumed(channel), abortFlag(), descs, stream);
}

void SignalWindow::signalAllPeers(SignalChannel channel, cudaStream_t stream)
    const {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != self_) {
      detail::launchSignal(remoteCounter(peer, channel), stream);
    }
  }
}

void SignalWindow::abortWaits() noexcept {
  reinterpret_cast<std::atomic<int>*>(abortFlag_.get())
      ->store(1, std::memory_order_release);
}

void putSignal(
    Communicator& comm,
    const void* src,
    size_t count,
    ncclDataType_t dtype,
    size_t bytes,
    int peer,
    const Window& window,
    size_t offsetBytes,
    cudaStream_t stream) {
  comm.get();   // an aborted communicator has unmapped its windows
  window.get(); // so has a closed window
  TORCH_CHECK_VALUE(
      window.communicator().get() == &comm,
      "nccl_core put_signal: the window belongs to another communicator; use "
      "the communicator of the group that registered it");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  if (oneSidedEngine() == OneSidedEngine::Host) {
    // NCCL reads the source zero-copy from a COLL_SYMMETRIC window only.
    if (comm.inSymmetricWindow(src, bytes)) {
      comm.noteCapture(stream); // NCCL's plan would hold the communicator
      comm.check(
          hostApi().putSignal(
              src,
              count,
              dtype,
              peer,
              window.get(),
              offsetBytes,
              0,
              0,
              0,
              comm.get(),
              stream),
          "ncclPutSignal");
      return;
    }
    // Other sources are copied to load/store peers directly, then signalled.
    copyToPeer(
        comm,
        src,
        bytes,
        peer,
        window,
        offsetBytes,
        "put_signal to it needs `src` inside a COLL_SYMMETRIC window of this "
        "communicator (NCCL's ncclPutSignal reads only such memory)",
        stream);
    signal(comm, peer, stream);
    return;
  }
  copyToPeer(
      comm, src, bytes, peer, window, offsetBytes, kNeedsHostApi, stream);
  detail::launchSignal(
      signalWindowOf(comm).remoteCounter(peer, SignalChannel::OneSided),
      stream);
}

void signal(Communicator& comm, int peer, cudaStream_t stream) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  if (oneSidedEngine() == OneSidedEngine::Host) {
    comm.noteCapture(stream);
    comm.check(
        hostApi().signal(peer, 0, 0, 0, comm.get(), stream), "ncclSignal");
    return;
  }
  comm.get();
  loadStorePeer(comm, peer, kNeedsHostApi);
  detail::launchSignal(
      signalWindowOf(comm).remoteCounter(peer, SignalChannel::OneSided),
      stream);
}

void waitSignal(
    Communicator& comm,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  if (oneSidedEngine() == OneSidedEngine::Host) {
    std::vector<HostApi::Desc> nccl;
    nccl.reserve(descs.size());
    for (const auto& d : descs) {
      nccl.push_back({d.opCount, d.peer, d.signalIndex, d.context});
    }
    comm.noteCapture(stream);
    comm.check(
        hostApi().waitSignal(
            static_cast<int>(nccl.size()), nccl.data(), comm.get(), stream),
        "ncclWaitSignal");
    return;
  }
  comm.get();
  for (const auto& d : descs) {
    loadStorePeer(comm, d.peer, kNeedsHostApi);
  }
  const SignalWindow& signals = signalWindowOf(comm);
  detail::launchWait(
      signals.inbox(SignalChannel::OneSided),
      signals.consumed(SignalChannel::OneSided),
      signals.abortFlag(),
      descs,
      stream);
}

} // namespace nccl_core

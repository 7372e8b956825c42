#include "nccl/one_sided.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/env.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "nccl/allocations.h"
#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

// NCCL >= 2.29's host one-sided API, where `api` has it.
bool hasHostApi(const NcclApi& api) {
  return api.putSignal != nullptr && api.signal != nullptr &&
         api.waitSignal != nullptr;
}

// `comm`'s table for the host engine, which NCCL's own table chose for the
// whole process: a communicator made with another table may lack the API.
const NcclApi& hostApiOf(const Communicator& comm) {
  NCCL_CORE_CHECK_SUPPORTED(
      hasHostApi(comm.api()),
      "one-sided",
      "this communicator's NCCL table has no host one-sided API (NCCL >= "
      "2.29)");
  return comm.api();
}

// The LSA rank of `peer`, or NotImplementedError saying what would reach it.
int loadStorePeer(Communicator& comm, int peer, const char* otherwise) {
  const std::optional<int> lsaRank = lsaRankOf(comm, peer);
  NCCL_CORE_CHECK_SUPPORTED(
      lsaRank.has_value(),
      "one-sided",
      "peer ",
      peer,
      " is not load/store reachable from this rank (no NVLink or PCIe P2P "
      "mapping); ",
      otherwise);
  return *lsaRank;
}

constexpr const char* kNeedsHostApi =
    "one-sided operations to it need NCCL >= 2.29";

// The copy engine writes the put's data straight into the peer's part of
// the window through this rank's mapping of it; no SM is used.
void copyToPeer(
    Communicator& comm,
    const PutSignal& put,
    const char* otherwise,
    cudaStream_t stream) {
  const int lsaRank = loadStorePeer(comm, put.peer, otherwise);
  const Window& window = put.window;
  const uintptr_t base =
      window
          .lsaBases(
              [&] { return lsaBases(comm, window.get(), lsaTeam(comm).size); })
          .at(lsaRank);
  C10_CUDA_CHECK(cudaMemcpyAsync(
      reinterpret_cast<void*>(base + put.offsetBytes),
      put.src,
      put.bytes,
      cudaMemcpyDeviceToDevice,
      stream));
}

SignalWindow& signalWindowOf(Communicator& comm) {
  SignalWindow* window = comm.signalWindow();
  NCCL_CORE_CHECK_STATE(
      window != nullptr,
      "one-sided",
      "register a window on this communicator first (its registration also "
      "sets up the signals)");
  return *window;
}

} // namespace

struct OneSidedLink::State {
  std::shared_mutex mutex; // held shared by each op running through `group`
  OneSidedGroup* group = nullptr;
};

namespace {

// The link of each communicator that has one. By address: a link lives no
// longer than its group, which holds the communicator.
struct Links {
  std::mutex mutex;
  std::unordered_map<const Communicator*, std::shared_ptr<OneSidedLink::State>>
      byCommunicator;
};

Links& links() {
  static auto* made = new Links(); // never destroyed: ops may run at exit
  return *made;
}

// "peer 1" or "peers 1, 2".
std::string peersText(c10::ArrayRef<int> peers) {
  std::string text = peers.size() == 1 ? "peer " : "peers ";
  for (size_t i = 0; i < peers.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(peers[i]);
  }
  return text;
}

// Runs `enqueue` (one-sided op `name` toward `peers` on `stream`) through
// the group `comm` serves; without one (gone, or never linked), as it is,
// naming the op in a DistBackendError.
void runInGroup(
    const Communicator& comm,
    const char* name,
    c10::ArrayRef<int> peers,
    bool waits,
    cudaStream_t stream,
    c10::function_ref<void()> enqueue) {
  // The group's event records and capture queries, on the communicator's
  // device like the op itself.
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  std::shared_ptr<OneSidedLink::State> state;
  {
    Links& all = links();
    std::lock_guard<std::mutex> lock(all.mutex);
    const auto found = all.byCommunicator.find(&comm);
    if (found != all.byCommunicator.end()) {
      state = found->second;
    }
  }
  if (state) {
    std::shared_lock<std::shared_mutex> lock(state->mutex);
    if (state->group != nullptr) {
      state->group->runOneSided(name, peers, waits, stream, enqueue);
      return;
    }
  }
  try {
    enqueue();
  } catch (const c10::DistBackendError& e) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str("nccl_core ", name, " (", peersText(peers), "): ", e.msg()));
  }
}

} // namespace

OneSidedLink::OneSidedLink(const Communicator& comm, OneSidedGroup& group)
    : comm_(&comm), state_(std::make_shared<State>()) {
  state_->group = &group;
  Links& all = links();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.byCommunicator[comm_] = state_;
}

OneSidedLink::~OneSidedLink() {
  {
    Links& all = links();
    std::lock_guard<std::mutex> lock(all.mutex);
    const auto found = all.byCommunicator.find(comm_);
    if (found != all.byCommunicator.end() && found->second == state_) {
      all.byCommunicator.erase(found);
    }
  }
  // Waits for the ops running through the group.
  std::unique_lock<std::shared_mutex> lock(state_->mutex);
  state_->group = nullptr;
}

void checkPeer(const Communicator& comm, int64_t peer, const char* op) {
  NCCL_CORE_CHECK_ARG(
      peer >= 0 && peer < comm.size() && peer != comm.rank(),
      op,
      "peer must be another rank of the group, 0 <= peer < ",
      comm.size(),
      " and != ",
      comm.rank(),
      ", got ",
      peer);
}

int checkedOpCount(int64_t count, const char* op) {
  NCCL_CORE_CHECK_ARG(
      count >= 1 && count <= std::numeric_limits<int>::max(),
      op,
      "op_count must be in [1, 2**31 - 1], got ",
      count);
  return static_cast<int>(count);
}

OneSidedEngine oneSidedEngine() {
  static const OneSidedEngine engine = [] {
    const auto value = c10::utils::get_env("TORCH_NCCL_CORE_ONE_SIDED_ENGINE");
    const std::string choice = value.value_or("auto");
    NCCL_CORE_CHECK_ARG(
        choice == "auto" || choice == "nccl" || choice == "load_store",
        "TORCH_NCCL_CORE_ONE_SIDED_ENGINE",
        "must be auto, nccl or load_store, got '",
        choice,
        "'");
    if (choice == "load_store") {
      return OneSidedEngine::LoadStore;
    }
    const bool host = hasHostApi(realNccl());
    NCCL_CORE_CHECK_SUPPORTED(
        host || choice == "auto",
        "TORCH_NCCL_CORE_ONE_SIDED_ENGINE",
        "nccl needs NCCL >= 2.29 at run time (ncclPutSignal)");
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

void enqueuePutSignal(
    Communicator& comm,
    const PutSignal& put,
    cudaStream_t stream) {
  comm.get();       // an aborted communicator has unmapped its windows
  put.window.get(); // so has a closed window
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  // The put goes through this rank's mapping of the target's part: freeing
  // the window's memory here waits for `stream`.
  noteWindowUse(put.window.userPtr(), stream);
  if (oneSidedEngine() == OneSidedEngine::Host) {
    // NCCL reads the source zero-copy from a COLL_SYMMETRIC window only.
    if (comm.inSymmetricWindow(put.src, put.bytes)) {
      comm.noteCapture(stream); // NCCL's plan would hold the communicator
      comm.check(
          hostApiOf(comm).putSignal(
              put.src,
              put.count,
              put.dtype,
              put.peer,
              put.window.get(),
              put.offsetBytes,
              0,
              0,
              0,
              comm.use().handle(),
              stream),
          "ncclPutSignal");
      return;
    }
    // Other sources are copied to load/store peers directly, then signalled.
    copyToPeer(
        comm,
        put,
        "put_signal to it needs `src` inside a COLL_SYMMETRIC window of this "
        "communicator (NCCL's ncclPutSignal reads only such memory)",
        stream);
    enqueueSignal(comm, put.peer, stream);
    return;
  }
  copyToPeer(comm, put, kNeedsHostApi, stream);
  detail::launchSignal(
      signalWindowOf(comm).remoteCounter(put.peer, SignalChannel::OneSided),
      stream);
}

void enqueueSignal(Communicator& comm, int peer, cudaStream_t stream) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  if (oneSidedEngine() == OneSidedEngine::Host) {
    comm.noteCapture(stream);
    comm.check(
        hostApiOf(comm).signal(peer, 0, 0, 0, comm.use().handle(), stream),
        "ncclSignal");
    return;
  }
  comm.get();
  loadStorePeer(comm, peer, kNeedsHostApi);
  detail::launchSignal(
      signalWindowOf(comm).remoteCounter(peer, SignalChannel::OneSided),
      stream);
}

void enqueueWaitSignal(
    Communicator& comm,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  if (oneSidedEngine() == OneSidedEngine::Host) {
    std::vector<NcclWaitSignalDesc> ncclDescs;
    ncclDescs.reserve(descs.size());
    for (const auto& d : descs) {
      ncclDescs.push_back({d.opCount, d.peer, d.signalIndex, d.context});
    }
    comm.noteCapture(stream);
    comm.check(
        hostApiOf(comm).waitSignal(
            static_cast<int>(ncclDescs.size()),
            ncclDescs.data(),
            comm.use().handle(), // the Use lasts the call: abort waits
            stream),
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

void putSignal(Communicator& comm, const PutSignal& put, cudaStream_t stream) {
  const int peers[] = {put.peer};
  runInGroup(comm, "put_signal", peers, /*waits=*/false, stream, [&] {
    enqueuePutSignal(comm, put, stream);
  });
}

void signal(Communicator& comm, int peer, cudaStream_t stream) {
  const int peers[] = {peer};
  runInGroup(comm, "signal", peers, /*waits=*/false, stream, [&] {
    enqueueSignal(comm, peer, stream);
  });
}

void waitSignal(
    Communicator& comm,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream) {
  c10::SmallVector<int, 4> peers;
  for (const auto& d : descs) {
    peers.push_back(d.peer);
  }
  runInGroup(comm, "wait_signal", peers, /*waits=*/true, stream, [&] {
    enqueueWaitSignal(comm, descs, stream);
  });
}

} // namespace nccl_core

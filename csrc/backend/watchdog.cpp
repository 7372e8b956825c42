#include "backend/watchdog.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Logging.h>

#include "nccl/errors.h"

namespace nccl_core {

namespace {
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// Store round trips are slower than event queries: look for peers' aborts
// less often (PyTorch's NCCL backend uses one second too).
constexpr auto kPeerCheckInterval = std::chrono::seconds(1);
const std::string kAbortKey = "nccl_core_abort";
} // namespace

Watchdog::Watchdog(
    std::shared_ptr<Communicator> comm,
    std::shared_ptr<FailureState> failure,
    c10::intrusive_ptr<c10d::Store> store,
    std::string groupName,
    std::chrono::milliseconds timeout,
    EventPool::Event syncTail)
    : comm_(std::move(comm)),
      failure_(std::move(failure)),
      store_(std::move(store)),
      groupName_(std::move(groupName)),
      timeout_(timeout),
      syncTail_(std::move(syncTail)),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  stop();
}

void Watchdog::track(c10::intrusive_ptr<NcclWork> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(std::move(work));
}

void Watchdog::noteSyncOp(cudaStream_t stream, const char* name, uint64_t seq) {
  C10_CUDA_CHECK(cudaEventRecord(syncTail_.get(), stream));
  syncName_.store(name, std::memory_order_relaxed);
  syncSeq_.store(seq, std::memory_order_release);
}

bool Watchdog::hasPendingWork() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !pending_.empty();
}

void Watchdog::fail(const std::string& reason, bool tellPeers) {
  if (!failure_->set(reason)) {
    return;
  }
  std::deque<c10::intrusive_ptr<NcclWork>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_);
  }
  // Fail the Work before aborting: an aborted kernel also completes its event.
  for (auto& work : pending) {
    work->markFailed(reason);
  }
  comm_->abort();
  if (tellPeers && storeReachable_) {
    try {
      store_->set(
          kAbortKey, std::vector<uint8_t>(reason.begin(), reason.end()));
    } catch (const std::exception& e) {
      LOG(WARNING) << "[nccl_core] could not tell peers of group '"
                   << groupName_ << "' to abort: " << e.what();
    }
  }
}

void Watchdog::trip(const std::string& reason, bool tellPeers) {
  if (!failure_->failed()) {
    LOG(ERROR) << "[nccl_core] " << reason;
  }
  fail(reason, tellPeers);
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void Watchdog::run() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm_->device()));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kPollInterval);
    if (stopping_ || failure_->failed()) {
      continue;
    }
    lock.unlock();
    try {
      poll();
    } catch (const std::exception& e) {
      trip(
          c10::str(
              "nccl_core watchdog of group '",
              groupName_,
              "' failed: ",
              e.what()),
          true);
    }
    lock.lock();
  }
}

void Watchdog::poll() {
  const auto now = std::chrono::steady_clock::now();
  ncclResult_t asyncError = comm_->asyncError();
  // ncclInProgress: a nonblocking communicator still settling a call.
  if (asyncError != ncclSuccess && asyncError != ncclInProgress) {
    trip(
        c10::str(
            "NCCL reported an asynchronous error on group '",
            groupName_,
            "': ",
            resultName(asyncError),
            ": ",
            ncclGetErrorString(asyncError)),
        true);
    return;
  }
  // Retire completed work in order; the first incomplete one decides.
  while (true) {
    c10::intrusive_ptr<NcclWork> head;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pending_.empty()) {
        break;
      }
      head = pending_.front();
    }
    if (head->gpuDone()) {
      head->releaseStash();
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.pop_front();
      continue;
    }
    if (head->pastDeadline(now)) {
      trip(
          c10::str(
              head->describe(),
              " timed out (timeout ",
              timeout_.count(),
              " ms); communicator aborted"),
          true);
      return;
    }
    break;
  }
  checkSyncOps(now);
  checkPeers(now);
}

void Watchdog::checkSyncOps(std::chrono::steady_clock::time_point now) {
  const uint64_t seq = syncSeq_.load(std::memory_order_acquire);
  if (seq == syncDoneSeq_) {
    return;
  }
  // The event was recorded for `seq` or later before we query it, so a
  // completed query proves `seq` done.
  cudaError_t status = cudaEventQuery(syncTail_.get());
  if (status == cudaSuccess) {
    syncDoneSeq_ = seq;
    syncStallSince_ = {};
    return;
  }
  if (status != cudaErrorNotReady) {
    C10_CUDA_CHECK(status);
  }
  if (syncStallSince_ == std::chrono::steady_clock::time_point{}) {
    syncStallSince_ = now;
  } else if (now - syncStallSince_ > timeout_) {
    trip(
        c10::str(
            "nccl_core synchronous ",
            syncName_.load(std::memory_order_relaxed),
            " (seq ",
            seq,
            ") on group '",
            groupName_,
            "' has not completed within the timeout (",
            timeout_.count(),
            " ms); communicator aborted"),
        true);
  }
}

void Watchdog::checkPeers(std::chrono::steady_clock::time_point now) {
  if (!storeReachable_ || now < nextPeerCheck_) {
    return;
  }
  nextPeerCheck_ = now + kPeerCheckInterval;
  try {
    if (store_->check({kAbortKey})) {
      auto reason = store_->get(kAbortKey);
      trip(
          c10::str(
              "a peer aborted group '",
              groupName_,
              "': ",
              std::string(reason.begin(), reason.end())),
          false);
    }
  } catch (const std::exception& e) {
    // The store's server may be gone at shutdown; stop asking it.
    storeReachable_ = false;
    LOG(WARNING) << "[nccl_core] store of group '" << groupName_
                 << "' unreachable: " << e.what();
  }
}

} // namespace nccl_core

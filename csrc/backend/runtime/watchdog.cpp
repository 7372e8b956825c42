#include "backend/runtime/watchdog.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Logging.h>

#include <algorithm>

#include "backend/runtime/flight_recorder.h"
#include "nccl/api.h"
#include "nccl/blocking_wait.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {
constexpr auto kWatchdogPollInterval = std::chrono::milliseconds(50);
// Store round trips are slower than event queries: look for peers' aborts
// less often (PyTorch's NCCL backend uses one second too).
constexpr auto kPeerCheckInterval = std::chrono::seconds(1);

// How far past its timeout a stuck synchronous op may be reported
// (SyncOpTimeline): a quarter of the timeout, at most one second.
std::chrono::steady_clock::duration
syncSpan(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::steady_clock::duration>(
      timeout / 4, std::chrono::seconds(1));
}
} // namespace

Watchdog::Watchdog(WatchedGroup group, std::chrono::milliseconds timeout)
    : comm_(std::move(group.comm)),
      failure_(std::move(group.failure)),
      hooks_(std::move(group.hooks)),
      ephemeral_(std::move(group.ephemeral)),
      store_(std::move(group.store)),
      groupName_(std::move(group.name)),
      abortKey_(std::move(group.abortKey)),
      traceGroup_(group.traceGroup),
      timeout_(timeout),
      syncOps_(CudaSpanEvents{std::move(group.events)}, syncSpan(timeout)),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  stop();
}

void Watchdog::track(c10::intrusive_ptr<NcclWork> work) {
  const uint64_t seq = work->getSequencenumber();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Checked under the lock fail() takes the list with: Work tracked after
    // the failure would never be failed, and its wait() would succeed.
    if (!failure_->failed()) {
      pending_.push_back(std::move(work));
      // After the push: a poll that reads `seq` finds the Work listed.
      lastTracked_.store(
          std::max(lastTracked_.load(std::memory_order_relaxed), seq),
          std::memory_order_release);
      return;
    }
  }
  work->markFailed(failure_->message());
  retire(std::move(work));
}

bool Watchdog::idle() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!std::all_of(pending_.begin(), pending_.end(), [](const auto& work) {
          return work->waitsOnPeers();
        })) {
      return false;
    }
  }
  const auto oldest =
      syncOps_.oldestUnfinished(std::chrono::steady_clock::now());
  // A one-sided wait may wait for a signal that never comes: shutdown ends
  // it (the abort releases the waiting kernel) rather than wait it out.
  return !oldest || oldest->detail.waitsOnPeers;
}

bool Watchdog::quiescent() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!std::all_of(pending_.begin(), pending_.end(), [](const auto& work) {
          return work->gpuDone();
        })) {
      return false;
    }
  }
  return !syncOps_.oldestUnfinished(std::chrono::steady_clock::now());
}

void Watchdog::retire(c10::intrusive_ptr<NcclWork> work) {
  std::lock_guard<std::mutex> lock(retiredMutex_);
  retired_.push_back(std::move(work));
  hasRetired_.store(true, std::memory_order_release);
}

void Watchdog::reapRetiredSlow() {
  std::vector<c10::intrusive_ptr<NcclWork>> retired;
  {
    std::lock_guard<std::mutex> lock(retiredMutex_);
    retired.swap(retired_);
    hasRetired_.store(false, std::memory_order_release);
  }
  for (auto& work : retired) {
    work->releaseStash();
  }
}

bool Watchdog::failWork(const std::string& reason) {
  if (!failure_->set(reason)) {
    return false;
  }
  std::deque<c10::intrusive_ptr<NcclWork>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_);
  }
  for (auto& work : pending) {
    work->markFailed(reason);
    retire(std::move(work));
  }
  return true;
}

void Watchdog::fail(const std::string& reason, bool tellPeers) {
  // The Work fails before the abort: an aborted kernel completes its event.
  const bool first = failWork(reason);
  comm_->abort(); // also after a failWork() alone
  if (first && tellPeers && storeReachable_) {
    try {
      store_->set(
          abortKey_, std::vector<uint8_t>(reason.begin(), reason.end()));
    } catch (const std::exception& e) {
      LOG(WARNING) << "[nccl_core] could not tell peers of group '"
                   << groupName_ << "' to abort: " << e.what();
    }
  }
}

void Watchdog::notifyCompletion(NcclWork& work) noexcept {
  for (size_t id : work.traces()) {
    FlightRecorder::process().complete(id);
  }
#if NCCL_CORE_HAS_COMPLETION_HOOKS
  // Only Work this thread took off the list, before any failure took the
  // rest: failed and timed-out Work fires nothing (c10d's contract).
  if (hooks_->completion.empty()) {
    return;
  }
  c10d::CompletionHookArgs args;
  args.completionKey = work.getCompletionKey();
  hooks_->completion.run("completion", groupName_, args);
#else
  (void)work;
#endif
}

void Watchdog::trip(const std::string& reason, bool tellPeers) {
  if (!failure_->failed()) {
    LOG(ERROR) << "[nccl_core] " << reason;
    // Before the abort: hooks see the group as it failed (torch's contract).
    hooks_->abort.run("abort", groupName_);
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
    // Without the GIL: the thread may be inside a Python abort hook, which
    // needs it to finish.
    runBlockingWait(
        [](void* thread) { static_cast<std::thread*>(thread)->join(); },
        &thread_);
  }
}

void Watchdog::run() {
  // Event queries are "unsafe" calls under another thread's global-mode
  // capture: in the default mode they would invalidate that capture.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  C10_CUDA_CHECK_WARN(comm_->api().exchangeStreamCaptureMode(&mode));
  C10_CUDA_CHECK_WARN(comm_->api().setDevice(comm_->device()));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kWatchdogPollInterval);
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
  // Read before the lists it bounds (see endEphemeralTimeouts).
  const uint64_t seen = std::max(
      lastTracked_.load(std::memory_order_acquire), syncOps_.lastNoted());
  const c10::intrusive_ptr<NcclWork> head = retireFinished();
  const auto oldestSync = syncOps_.oldestUnfinished(now);
  if (traceGroup_) {
    FlightRecorder::process().syncOpsFinishedBefore(
        *traceGroup_, syncOps_.finishedBefore());
  }
  if (failedAsynchronously(head, oldestSync)) {
    return;
  }
  if (head && head->pastDeadline(now)) {
    trip(
        c10::str(
            "Watchdog caught collective operation timeout: ",
            head->describe(),
            " ran past its timeout; communicator aborted"),
        true);
    return;
  }
  if (oldestSync && syncOpTimedOut(*oldestSync)) {
    return;
  }
  if (enqueueTimedOut(now)) {
    return;
  }
  endEphemeralTimeouts(
      seen, oldestSync ? std::optional(oldestSync->seq) : std::nullopt);
  checkPeers(now);
}

c10::intrusive_ptr<NcclWork> Watchdog::retireFinished() {
  // In order: the first incomplete one decides.
  while (true) {
    c10::intrusive_ptr<NcclWork> head;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pending_.empty()) {
        return {};
      }
      head = pending_.front();
    }
    if (!head->gpuDone()) {
      return head;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pending_.empty() || pending_.front() != head) {
        return {}; // fail() took the list meanwhile
      }
      pending_.pop_front();
    }
    notifyCompletion(*head);
    retire(std::move(head));
  }
}

bool Watchdog::failedAsynchronously(
    const c10::intrusive_ptr<NcclWork>& head,
    const std::optional<SyncOpTimeline::Unfinished>& oldestSync) {
  const ncclResult_t asyncError = comm_->asyncError();
  // ncclInProgress: a nonblocking communicator still settling a call.
  if (asyncError == ncclSuccess || asyncError == ncclInProgress) {
    return false;
  }
  const std::string error = c10::str(
      "NCCL reported an asynchronous error: ",
      resultName(asyncError),
      " (",
      comm_->api().getErrorString(asyncError),
      "); NCCL's last message: ",
      comm_->lastError());
  if (!head && !oldestSync) {
    // No op was in flight: on the network transport that is a peer that
    // closed its connections, as at a clean teardown. Nothing was lost, so
    // nothing is logged or told to peers (torch's NCCL backend asks NCCL
    // only per Work); the next op raises this at once.
    fail(
        c10::str(
            "group '",
            groupName_,
            "' failed while no op was in flight: ",
            error,
            "; communicator aborted"),
        /*tellPeers=*/false);
    return true;
  }
  const bool syncIsOlder =
      oldestSync && (!head || oldestSync->seq < head->getSequencenumber());
  trip(
      c10::str(
          syncIsOlder ? describeSyncOp(*oldestSync) : head->describe(),
          " failed: ",
          error,
          "; communicator aborted"),
      true);
  return true;
}

std::string
Watchdog::describeSyncOp(const SyncOpTimeline::Unfinished& op) const {
  return c10::str(
      "nccl_core synchronous ",
      op.name,
      " (seq ",
      op.seq,
      describePeers(op.detail),
      ") on group '",
      groupName_,
      "'");
}

Watchdog::Enqueueing::Enqueueing(
    Watchdog& watchdog,
    const char* name,
    uint64_t seq,
    std::chrono::milliseconds timeout)
    : watchdog_(watchdog), seq_(seq) {
  std::lock_guard<std::mutex> lock(watchdog_.enqueueingMutex_);
  watchdog_.enqueueing_.push_back(
      InEnqueue{name, seq, std::chrono::steady_clock::now(), timeout});
}

Watchdog::Enqueueing::~Enqueueing() {
  std::lock_guard<std::mutex> lock(watchdog_.enqueueingMutex_);
  auto& ops = watchdog_.enqueueing_;
  const auto it = std::find_if(ops.begin(), ops.end(), [this](const auto& op) {
    return op.seq == seq_;
  });
  if (it != ops.end()) {
    ops.erase(it);
  }
}

bool Watchdog::enqueueTimedOut(std::chrono::steady_clock::time_point now) {
  std::optional<InEnqueue> late;
  {
    std::lock_guard<std::mutex> lock(enqueueingMutex_);
    for (const InEnqueue& op : enqueueing_) {
      if (now - op.since > op.timeout) {
        late = op;
        break;
      }
    }
  }
  if (!late) {
    return false;
  }
  trip(
      c10::str(
          "Watchdog caught collective operation timeout: nccl_core ",
          late->name,
          " (seq ",
          late->seq,
          ") on group '",
          groupName_,
          "' has been in NCCL's enqueue for at least ",
          std::chrono::duration_cast<std::chrono::milliseconds>(
              now - late->since)
              .count(),
          " ms (timeout ",
          late->timeout.count(),
          " ms): NCCL waits there for peers that have not joined the op; "
          "communicator aborted"),
      true);
  return true;
}

bool Watchdog::syncOpTimedOut(const SyncOpTimeline::Unfinished& oldest) {
  const std::chrono::milliseconds timeout =
      timeout_.load() + ephemeral_->active();
  if (oldest.age <= timeout) {
    return false;
  }
  trip(
      c10::str(
          // torch's NCCL backend's wording, which tools and tests look for.
          "Watchdog caught collective operation timeout: ",
          describeSyncOp(oldest),
          " has been unfinished for at least ",
          std::chrono::duration_cast<std::chrono::milliseconds>(oldest.age)
              .count(),
          " ms (timeout ",
          timeout.count(),
          " ms); communicator aborted"),
      true);
  return true;
}

void Watchdog::endEphemeralTimeouts(
    uint64_t seen,
    std::optional<uint64_t> oldestSync) {
  if (ephemeral_->active().count() == 0) {
    return;
  }
  uint64_t unfinished = std::min(oldestSync.value_or(seen + 1), seen + 1);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& work : pending_) {
    // An async one-sided wait may wait for long: it keeps its own deadline
    // but holds no extension in force (nor does finished Work queued
    // behind one).
    if (!work->waitsOnPeers() && !work->gpuDone()) {
      unfinished = std::min(unfinished, work->firstSeq());
    }
  }
  ephemeral_->finishedBelow(unfinished);
}

void Watchdog::checkPeers(std::chrono::steady_clock::time_point now) {
  if (!storeReachable_ || now < nextPeerCheck_) {
    return;
  }
  nextPeerCheck_ = now + kPeerCheckInterval;
  try {
    if (store_->check({abortKey_})) {
      auto reason = store_->get(abortKey_);
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

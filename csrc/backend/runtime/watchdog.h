// One thread per backend that turns hangs and asynchronous failures into
// errors: it retires completed async Work, times out Work and synchronous ops
// whose age passes the timeout, polls NCCL's asynchronous error, and watches
// the store for a peer's abort. On any of these it records the failure, fails
// pending Work, aborts the communicator and tells the peers through the store,
// so that every rank's next call raises DistBackendError instead of hanging.
//
// The thread never blocks on the GPU or on user code: it runs in CUDA's
// thread-local capture mode (its event queries cannot invalidate a graph
// capture on another thread), and retired Work goes to a list the caller's
// thread drops (reapRetired), so no tensor, NCCL memory or Python object is
// freed here.
#pragma once

#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/runtime/ephemeral_timeouts.h"
#include "backend/runtime/event_pool.h"
#include "backend/runtime/failure.h"
#include "backend/runtime/hooks.h"
#include "backend/runtime/sync_ops.h"
#include "backend/runtime/work.h"
#include "nccl/communicator.h"

namespace nccl_core {

// The group a watchdog watches: its communicator and failure record, the
// store where its ranks tell each other of a failure (under `abortKey`), and
// what a failure or a finished op is reported to.
struct WatchedGroup {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<FailureState> failure;
  c10::intrusive_ptr<c10d::Store> store;
  std::string name;
  std::string abortKey;
  std::shared_ptr<EventPool> events;
  std::shared_ptr<BackendHooks> hooks;
  std::shared_ptr<EphemeralTimeouts> ephemeral;
  std::optional<size_t> traceGroup = std::nullopt;
};

class Watchdog {
 public:
  Watchdog(WatchedGroup group, std::chrono::milliseconds timeout);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog();

  void track(c10::intrusive_ptr<NcclWork> work);

  // Marks the end of a synchronous op on `stream` (see SyncOpTimeline); a
  // one-sided op passes its peers in `detail`.
  void noteSyncOp(
      cudaStream_t stream,
      const char* name,
      uint64_t seq,
      const SyncOpDetail* detail = nullptr) {
    syncOps_.note(stream, name, seq, std::chrono::steady_clock::now(), detail);
  }

  // Times an op while NCCL enqueues it on the host, as synchronous ops are
  // timed on the GPU: a blocking communicator may wait there for peers that
  // never join (NCCL connects peers at an algorithm's first use,
  // NCCL_RUNTIME_CONNECT), and only the watchdog's abort ends that wait.
  class Enqueueing {
   public:
    Enqueueing(
        Watchdog& watchdog,
        const char* name,
        uint64_t seq,
        std::chrono::milliseconds timeout);
    Enqueueing(const Enqueueing&) = delete;
    Enqueueing& operator=(const Enqueueing&) = delete;
    ~Enqueueing();

   private:
    Watchdog& watchdog_;
    const uint64_t seq_;
  };

  // Records `reason`, fails pending work, aborts the communicator and (when
  // `tellPeers`) asks the other ranks to abort too. Idempotent.
  void fail(const std::string& reason, bool tellPeers);
  // The first half of fail(): records `reason` and fails pending Work, but
  // leaves the communicator alone. False if the group had failed already.
  bool failWork(const std::string& reason);

  // The age at which a synchronous op fails, from the next poll on; async
  // Work keeps the timeout it was issued with.
  void setTimeout(std::chrono::milliseconds timeout) {
    timeout_.store(timeout, std::memory_order_relaxed);
  }

  // Fails and drops work not yet completed, then joins the thread.
  void stop();

  // Whether every tracked async Work and every synchronous op finished, but
  // for one-sided waits, which shutdown ends rather than waits for.
  bool idle();
  // Whether nothing of the group is left on the GPU: every tracked async Work
  // finished there (asked of its event, not of this thread's bookkeeping),
  // one-sided waits included, and every synchronous op.
  bool quiescent();

  // Drops, on the calling thread, the Work the watchdog retired (its tensors
  // and futures go with it). Cheap when there is none.
  void reapRetired() {
    if (C10_UNLIKELY(hasRetired_.load(std::memory_order_acquire))) {
      reapRetiredSlow();
    }
  }

 private:
  // fail(), logged and after the abort hooks: for failures the watchdog
  // itself detects (a timeout, an NCCL error, a peer's abort).
  void trip(const std::string& reason, bool tellPeers);
  void retire(c10::intrusive_ptr<NcclWork> work);
  // The flight recorder and the completion hooks, for Work that finished
  // successfully.
  void notifyCompletion(NcclWork& work) noexcept;
  void reapRetiredSlow();
  void run();
  void poll();
  // Retires the async Work that finished, in order; the first that has not.
  c10::intrusive_ptr<NcclWork> retireFinished();
  // Fails the group if NCCL reported an asynchronous error, naming the
  // oldest unfinished op (`head` or `oldestSync`); quietly if there is none.
  bool failedAsynchronously(
      const c10::intrusive_ptr<NcclWork>& head,
      const std::optional<SyncOpTimeline::Unfinished>& oldestSync);
  // Fails the group if an op stayed in NCCL's enqueue past its timeout.
  bool enqueueTimedOut(std::chrono::steady_clock::time_point now);
  // Fails the group if `oldest` ran past the timeout.
  bool syncOpTimedOut(const SyncOpTimeline::Unfinished& oldest);
  std::string describeSyncOp(const SyncOpTimeline::Unfinished& op) const;
  // Ends the timeout extensions whose first op finished: every op up to it
  // finished, among those numbered up to `seen` (later ones may not be
  // tracked yet).
  void endEphemeralTimeouts(uint64_t seen, std::optional<uint64_t> oldestSync);
  void checkPeers(std::chrono::steady_clock::time_point now);

  const std::shared_ptr<Communicator> comm_;
  const std::shared_ptr<FailureState> failure_;
  const std::shared_ptr<BackendHooks> hooks_;
  const std::shared_ptr<EphemeralTimeouts> ephemeral_;
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string groupName_;
  const std::string abortKey_;
  // The group in the flight recorder, told which synchronous ops finished.
  const std::optional<size_t> traceGroup_;
  std::atomic<std::chrono::milliseconds> timeout_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<c10::intrusive_ptr<NcclWork>> pending_;
  std::atomic<uint64_t> lastTracked_{0}; // the newest Work tracked
  bool stopping_ = false;

  std::mutex retiredMutex_;
  std::vector<c10::intrusive_ptr<NcclWork>> retired_;
  std::atomic<bool> hasRetired_{false};

  SyncOpTimeline syncOps_;
  struct InEnqueue {
    const char* name;
    uint64_t seq;
    std::chrono::steady_clock::time_point since;
    std::chrono::milliseconds timeout;
  };
  std::mutex enqueueingMutex_;
  std::vector<InEnqueue> enqueueing_; // few: one per thread in an enqueue
  std::chrono::steady_clock::time_point nextPeerCheck_{};
  std::atomic<bool> storeReachable_{true};

  std::thread thread_;
};

} // namespace nccl_core

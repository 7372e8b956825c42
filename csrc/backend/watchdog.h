// One thread per backend that turns hangs and asynchronous failures into
// errors: it retires completed async Work, times out Work and synchronous ops
// that run too long, polls NCCL's asynchronous error, and watches the store
// for a peer's abort. On any of these it records the failure, fails pending
// Work, aborts the communicator and tells the peers through the store, so that
// every rank's next call raises DistBackendError instead of hanging.
#pragma once

#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/event_pool.h"
#include "backend/failure.h"
#include "backend/work.h"
#include "nccl/communicator.h"

namespace nccl_core {

class Watchdog {
 public:
  Watchdog(
      std::shared_ptr<Communicator> comm,
      std::shared_ptr<FailureState> failure,
      c10::intrusive_ptr<c10d::Store> store,
      std::string groupName,
      std::chrono::milliseconds timeout,
      EventPool::Event syncTail);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog();

  void track(c10::intrusive_ptr<NcclWork> work);

  // Marks the end of a synchronous op on `stream`: one reused event, so the
  // lean path costs a single cudaEventRecord.
  void noteSyncOp(cudaStream_t stream, const char* name, uint64_t seq);

  // Records `reason`, fails pending work, aborts the communicator and (when
  // `tellPeers`) asks the other ranks to abort too. Idempotent.
  void fail(const std::string& reason, bool tellPeers);

  // Fails and drops work not yet completed, then joins the thread.
  void stop();

  bool hasPendingWork();

 private:
  // fail(), logged: for failures the watchdog itself detects.
  void trip(const std::string& reason, bool tellPeers);
  void run();
  void poll();
  void checkSyncOps(std::chrono::steady_clock::time_point now);
  void checkPeers(std::chrono::steady_clock::time_point now);

  const std::shared_ptr<Communicator> comm_;
  const std::shared_ptr<FailureState> failure_;
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string groupName_;
  const std::chrono::milliseconds timeout_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<c10::intrusive_ptr<NcclWork>> pending_;
  bool stopping_ = false;

  const EventPool::Event syncTail_;
  std::atomic<uint64_t> syncSeq_{0};
  std::atomic<const char*> syncName_{""};
  uint64_t syncDoneSeq_ = 0; // watchdog thread only
  std::chrono::steady_clock::time_point syncStallSince_{};
  std::chrono::steady_clock::time_point nextPeerCheck_{};
  std::atomic<bool> storeReachable_{true};

  std::thread thread_;
};

} // namespace nccl_core

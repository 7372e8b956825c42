// A scripted NCCL for CPU tests, an NcclApi table (api.h) that communicators
// are made with (create_communicator, or a group's injected options):
// communicators are host objects, a call can be held inside NCCL (a blocking
// communicator's thread waits until released or revoked; a nonblocking one's
// call stays ncclInProgress) or made to fail, and misuse that would crash real
// NCCL (ncclCommAbort under a call in progress, a call on a freed communicator)
// is counted instead. Collectives and point-to-point calls enqueue nothing, so
// that a benchmark on a GPU can tell the backend's host time from NCCL's;
// registrations and windows hand out handles that stand for nothing. Entry
// points no such path reaches (memory, one-sided) stay null. On request it
// records each collective, point-to-point and group call with its arguments,
// so that CPU tests read what an op asked NCCL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "nccl/api.h"

namespace nccl_core {

class FakeNccl {
 public:
  // Makes the fake the current one (its entry points are plain functions
  // that find it: one at a time). With `realCuda` the CUDA runtime calls
  // of the table stay the runtime's (on a GPU: the watchdog's thread-local
  // capture mode must hold while another thread captures a CUDA graph).
  // Without `revoke` the table has no ncclCommRevoke (NCCL < 2.28.7), without
  // `suspend` no ncclCommSuspend / ncclCommResume / ncclCommMemStats
  // (NCCL < 2.29.7), without `grow` no ncclCommGrow / ncclCommGetUniqueId
  // (NCCL < 2.29).
  explicit FakeNccl(
      bool realCuda = false,
      bool revoke = true,
      bool suspend = true,
      bool grow = true);
  FakeNccl(const FakeNccl&) = delete;
  FakeNccl& operator=(const FakeNccl&) = delete;
  ~FakeNccl();
  // Stops being the current fake now, not whenever Python frees it (a
  // traceback cycle can keep it alive); idempotent. Its communicators must be
  // gone by then.
  void uninstall();

  // The table to make communicators with.
  const NcclApi& table() const {
    return table_;
  }

  // Calls of `call` ("ncclCommSplit", ...) wait inside NCCL until released.
  void hold(const std::string& call);
  void release(const std::string& call);
  // The next call of `call` returns `result`.
  void failNext(const std::string& call, int result);
  // What ncclCommGetAsyncError reports once nothing is pending.
  void setAsyncError(int result);

  int calls(const std::string& call);
  // Threads inside `call` now (held, or not yet returned).
  int inside(const std::string& call);
  // A collective, point-to-point or group call as NCCL was asked it.
  struct Record {
    std::string call;               // "ncclAllReduce", "ncclGroupStart", ...
    std::vector<uintptr_t> buffers; // the send buffer, then the receive one
    size_t count = 0;
    int dtype = -1;
    int op = -1;   // the reduce op
    int peer = -1; // the root or the peer
    int rank = -1; // the communicator's rank
    uintptr_t stream = 0;
  };
  // Records calls from now on (`on`), or no longer.
  void record(bool on);
  // The calls recorded since the last take.
  std::vector<Record> takeRecorded();
  bool recording() const {
    return recording_.load(std::memory_order_relaxed);
  }
  // For the entry points: keeps `record` if recording.
  void note(Record record);

  // What ncclCommMemStats reports of every communicator: bytes suspend
  // releases, and bytes it keeps.
  static constexpr uint64_t kSuspendableBytes = 1 << 20;
  static constexpr uint64_t kPersistentBytes = 64 << 10;

  // Communicators made and not yet aborted.
  int live();
  // ncclCommAbort while a call on the same communicator was in progress.
  int abortedUnderCall();
  // Calls on a communicator after its ncclCommAbort (a second abort too).
  int usedAfterFree();

  // The fake in use, for the entry points (plain functions).
  static FakeNccl& current();

  struct Comm {
    int rank;
    int size;
    bool blocking;
    bool freed = false;
    // ncclCommRevoke raised its abort flag: held calls return an error.
    bool revoked = false;
    // ncclCommFinalize or ncclCommRevoke was called; NCCL refuses both
    // after either (ncclInvalidArgument, init.cc).
    bool finalizing = false;
    // ncclCommSuspend released its memory (a second one is misuse, as in
    // NCCL: ncclInvalidUsage).
    bool suspended = false;
    int inside = 0;
    std::string pending; // a nonblocking call still in progress
    // Where a pending split or shrink writes its child once it completes
    // (as NCCL writes it only then), and the child's rank and size.
    ncclComm_t* pendingChild = nullptr;
    const ncclConfig_t* pendingConfig = nullptr;
    int pendingRank = 0;
    int pendingSize = 0;
  };

  // Entry and exit of a call on `comm` (may be null); returns the scripted
  // result, ncclInProgress for a held call on a nonblocking communicator.
  ncclResult_t enter(const char* call, Comm* comm);
  void leave(const char* call, Comm* comm);
  Comm* make(int rank, int size, const ncclConfig_t* config, bool parentBlocks);
  // A split or shrink: its child of `rank` and `size` now, or once the held
  // nonblocking call completes.
  void derive(
      Comm* parent,
      int rank,
      int size,
      ncclComm_t* child,
      const ncclConfig_t* config);
  // The flags of the last ncclCommShrink.
  int lastShrinkFlags();
  void noteShrinkFlags(int flags);
  ncclResult_t asyncState(Comm* comm, ncclResult_t* state);
  void abort(Comm* comm);
  ncclResult_t revoke(Comm* comm);
  // False where NCCL refuses the finalize (see Comm::finalizing).
  bool startFinalize(Comm* comm);

 private:
  Comm*
  makeLocked(int rank, int size, const ncclConfig_t* config, bool parentBlocks);

  std::mutex mutex_;
  std::condition_variable released_;
  std::set<std::string> held_;
  std::map<std::string, int> failNext_;
  std::map<std::string, int> calls_;
  std::map<std::string, int> inside_;
  ncclResult_t asyncError_ = ncclSuccess;
  int abortedUnderCall_ = 0;
  int usedAfterFree_ = 0;
  int lastShrinkFlags_ = -1;
  std::atomic<bool> recording_{false};
  std::vector<Record> recorded_;
  std::vector<std::unique_ptr<Comm>> comms_; // never freed: misuse is seen
  NcclApi table_{};
};

} // namespace nccl_core

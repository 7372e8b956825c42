// Move-only RAII owner of one ncclComm_t and of the resources registered with
// it. Nothing outside csrc/nccl calls ncclComm* directly.
#pragma once

#include <c10/util/FunctionRef.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nccl/allocations.h"
#include "nccl/api.h"
#include "nccl/captured_graphs.h"
#include "nccl/one_sided.h"
#include "nccl/resources.h"
#include "nccl/window_layout.h"

namespace nccl_core {

class Communicator;

// What the layer above (the backend's routing, backend/routing/comm_routes.h)
// hears of a communicator: the NCCL layer holds no policy of its own about
// windows or aborts. Held weakly, like an AllocationObserver.
class CommunicatorListener {
 public:
  virtual ~CommunicatorListener() = default;
  // On every rank before a window with `flags` is registered, at the same
  // point of the collective order, so it may run collectives of its own.
  virtual void beforeWindow(Communicator& comm, int flags) = 0;
  // `window` was registered and is tracked.
  virtual void windowRegistered(const std::shared_ptr<Window>& window) = 0;
  // Once, when the communicator is aborted: its signal waits have ended, and
  // NCCL has not yet freed its resources. Called without its lock.
  virtual void aborting() noexcept = 0;
  // Then, once NCCL was asked to abort it (its kernels end), so that what
  // depends on it can go: a communicator freed first would wait for those
  // kernels (device-wide synchronizing frees). Where another thread still
  // holds a Use, NCCL is asked only when that Use ends.
  virtual void aborted() noexcept = 0;
};

class Communicator final : public AllocationObserver,
                           public std::enable_shared_from_this<Communicator> {
 public:
  // What create() makes: a communicator of its own (ncclCommInitRankConfig),
  // or a new process's part in another communicator's grow (ncclCommGrow,
  // NCCL >= 2.29; `id` is the growing communicator's growId()).
  enum class Joining { Init, Grow };
  // How a communicator runs: the NCCL entry points it calls all its life
  // (NCCL's own, or a test's scripted table), its device and config, how
  // long a nonblocking call may stay in progress before it is aborted, and
  // its name in errors ("group 'name'"). Communicators made from it take its
  // table, device and timeout.
  struct Settings {
    const NcclApi* api;
    int device;
    ncclConfig_t config;
    std::chrono::milliseconds timeout;
    std::string label;
  };
  using Started = std::function<void(const std::shared_ptr<Communicator>&)>;
  // Collective over the `nranks` processes that share `id`. A nonblocking
  // config (blocking = 0) is waited for up to the timeout, then aborted.
  // `started` sees the communicator before it is waited for, so that another
  // thread can abort a late initialization.
  static std::shared_ptr<Communicator> create(
      int nranks,
      int rank,
      const ncclUniqueId& id,
      Settings settings,
      const Started& started = nullptr,
      Joining how = Joining::Init);

  // ncclGetUniqueId through `api`: the id of a new communicator, made on one
  // of its ranks and passed to the others.
  static ncclUniqueId uniqueId(const NcclApi& api);

  // ncclCommSplit, collective over this communicator. Returns nullptr on a
  // rank that passes color < 0 (it joins no new communicator). `label` names
  // the new one in errors.
  std::shared_ptr<Communicator>
  split(int color, int key, ncclConfig_t config, std::string label);
  // ncclCommShrink (NCCL >= 2.27), collective over the ranks that stay:
  // a communicator without `excludedRanks`, the others renumbered in order.
  // `flags` NCCL_SHRINK_ABORT first ends the ops in flight on this one.
  std::shared_ptr<Communicator> shrink(
      std::vector<int> excludedRanks,
      int flags,
      ncclConfig_t config,
      std::string label);

  // ncclCommGrow (NCCL >= 2.29, csrc/nccl/communicator_grow.cpp): a
  // communicator of `newSize` ranks in which this one's keep their numbers
  // and processes that join (create, Joining::Grow) take the others.
  // Collective over this communicator; one rank first takes the id the
  // joining processes need (growId), and passes it here, the others pass
  // null.
  std::shared_ptr<Communicator> grow(
      int newSize,
      const ncclUniqueId* id,
      ncclConfig_t config,
      std::string label);
  // ncclCommGetUniqueId: the id of the next grow, on one rank of this
  // communicator; NCCL hands it to the others within grow().
  ncclUniqueId growId();
  // NotImplementedError naming `op` where `api` cannot grow.
  static void requireGrowSupport(const NcclApi& api, const char* op);

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() override;

  // A thread's stay inside NCCL on this communicator. While any is held,
  // abort() leaves ncclCommAbort to the last one to end, so NCCL never frees
  // the communicator under a call in progress. Taking one throws
  // DistBackendError once the communicator was aborted.
  class Use {
   public:
    explicit Use(Communicator& comm);
    Use(Use&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    Use& operator=(Use&&) = delete;
    ~Use();
    ncclComm_t handle() const {
      return comm_->comm_;
    }

   private:
    Communicator* comm_;
  };
  Use use() {
    return Use(*this);
  }

  // A Use for a collective host call that waits in NCCL's bootstrap for the
  // peers (a window registration, a split or shrink): abort() revokes the
  // communicator while one is in progress, which ends that wait. Counted
  // before the Use checks for an abort (abort() sets that, then reads the
  // count): one of the two sees the other.
  // It is refused (RuntimeError) while the communicator is suspended, but
  // for resume's own call (`whileSuspended`).
  class HostCall {
   public:
    explicit HostCall(Communicator& comm, bool whileSuspended = false)
        : counted_(comm),
          use_(whileSuspended ? comm : comm.refuseWhileSuspended()) {}
    ncclComm_t handle() const {
      return use_.handle();
    }

   private:
    struct Counted {
      explicit Counted(Communicator& comm) : comm(comm) {
        comm.hostCalls_.fetch_add(1);
      }
      Counted(const Counted&) = delete;
      Counted& operator=(const Counted&) = delete;
      ~Counted() {
        comm.hostCalls_.fetch_sub(1);
      }
      Communicator& comm;
    };
    const Counted counted_;
    const Use use_;
  };

  // The raw handle, for enqueueing operations. Throws DistBackendError once
  // the communicator was aborted. Prefer use(), which also fences abort().
  ncclComm_t get() const;
  const std::string& label() const {
    return label_;
  }

  int rank() const {
    return rank_;
  }
  int size() const {
    return size_;
  }
  int device() const {
    return device_;
  }
  // The NCCL entry points it calls.
  const NcclApi& api() const {
    return *api_;
  }
  // The config it was made with, for communicators derived from it.
  const ncclConfig_t& config() const {
    return config_;
  }
  bool isAborted() const {
    return aborted_.load(std::memory_order_acquire);
  }
  // How long a nonblocking call may stay in progress before the communicator
  // is aborted.
  std::chrono::milliseconds timeout() const {
    return timeout_.load(std::memory_order_relaxed);
  }
  void setTimeout(std::chrono::milliseconds timeout);

  // Raises DistBackendError naming `call`, this communicator and the
  // caller's file and line (filled in where it is called) unless `result` is
  // a success. On a nonblocking communicator ncclInProgress is waited for
  // first.
  void check(
      ncclResult_t result,
      const char* call,
      const char* file = __builtin_FILE(),
      int line = __builtin_LINE());

  // Frees the communicator and every resource registered with it, and makes
  // any operation still running on it return, a blocking host call in
  // progress on another thread too (NCCL >= 2.28.7; not once a finalize
  // started, see flush: the call holds the handle until it returns, and NCCL
  // refuses the revoke that would end it). Idempotent (a concurrent call
  // returns once the first one is through), never throws, never waits for
  // peers. While CUDA graphs that captured its work are
  // alive, NCCL frees it on a thread of its own once they are destroyed.
  void abort() noexcept;
  // Makes its kernels and blocking host calls end without freeing it
  // (ncclCommRevoke, NCCL >= 2.28.7), for an abort that must free another
  // communicator first: frees synchronize the device. Only on a blocking
  // communicator no live CUDA graph holds; false where it did nothing. It
  // takes no work after.
  bool stopKernels() noexcept;
  // Lets this rank's proxy finish moving the data of ops its GPU finished
  // (ncclCommFinalize): over a network a send's kernel can end while its
  // data is still on the way, which ncclCommAbort would drop, leaving the
  // peer a wrong result. Waited for up to the timeout; false past it, and
  // while CUDA graphs that captured its work are alive (NCCL waits for
  // them). Nothing ends a blocking finalize early (NCCL refuses
  // ncclCommRevoke once it started), so past the timeout it is left to
  // finish on a thread of its own, and the abort that follows frees the
  // communicator when it does.
  bool flush() noexcept;
  // Whether flush would finalize: not aborted, suspended or finalizing, and
  // no CUDA graph that captured its work alive.
  bool finalizable() const noexcept;
  // The same, telling `instead` too: a listener that is being destroyed can
  // no longer be reached as one.
  void abort(CommunicatorListener& instead) noexcept;

  // Work of this communicator was enqueued on `stream`, which is capturing.
  void noteCapture(cudaStream_t stream) {
    capturedGraphs_.note(stream);
  }

  // NCCL's own memory of this communicator, in bytes (ncclCommMemStats).
  struct MemoryStats {
    uint64_t suspendable; // what suspend() releases
    uint64_t persistent;  // what it keeps
    uint64_t total;
    bool suspended;
  };
  // Raises NotImplementedError naming `op` unless `api` can suspend
  // communicators (NCCL >= 2.29.7).
  static void requireSuspendSupport(const NcclApi& api, const char* op);
  // Releases the memory NCCL can release (ncclCommSuspend with
  // NCCL_SUSPEND_MEM); NCCL takes no work on it until resume() restores it,
  // so host calls are refused meanwhile. Both idempotent, and collective (a
  // barrier of every rank in NCCL's memory manager): an abort ends a wait
  // for a rank that never comes. The caller sees to it that no op of it is
  // in flight and no CUDA graph holds its work.
  void suspend();
  void resume();
  bool isSuspended() const {
    return suspended_.load(std::memory_order_acquire);
  }
  MemoryStats memoryStats();
  // CUDA graphs alive that captured its work.
  int liveGraphs() const {
    return capturedGraphs_.live();
  }

  // The asynchronous error NCCL recorded, ncclSuccess when there is none.
  ncclResult_t asyncError();
  // NCCL's last error message (ncclGetLastError), empty once aborted.
  std::string lastError();

  // Resources (see resources.h), tracked until closed.
  std::shared_ptr<RegisteredBuffer> registerBuffer(void* ptr, size_t bytes);
  // Collective: every rank registers its part together, `layout` holding
  // every rank's (exchangeLayout). A layout NCCL would address wrongly
  // (layoutConflict) raises ValueError on every rank before NCCL is asked.
  std::shared_ptr<Window>
  registerWindow(void* ptr, size_t bytes, int flags, WindowLayout layout);
  std::shared_ptr<CustomRedOp>
  createPreMulSum(const void* hostScalar, ncclDataType_t dtype);
  // The window of this communicator covering [ptr, ptr + bytes), if any.
  std::shared_ptr<Window> findWindow(const void* ptr, size_t bytes);
  // Whether a window of this communicator overlaps [ptr, ptr + bytes): NCCL
  // looks windows up by address, so another one there would be ambiguous.
  bool overlapsWindow(const void* ptr, size_t bytes);
  size_t resourceCount();

  // Tracks a device communicator made by createDevComm (dev_comm.h).
  std::shared_ptr<class DevComm> adoptDevComm(std::shared_ptr<void> devComm);

  // The signal window, null until signals() made it: the LoadStore
  // one-sided engine makes it with the first window. A one-sided resource of
  // the communicator, like NCCL's own signals: the Communicator API's
  // put_signal / wait_signal use it without any group.
  SignalWindow* signalWindow();
  // The signal window, made on first call (collective then). Needs
  // windowAddressesReadable().
  SignalWindow& signals();
  // A window for this package's own use: not a tracked resource, released
  // when the communicator is aborted or destroyed. Collective.
  ncclWindow_t registerInternalWindow(void* ptr, size_t bytes);

  // Destroys a custom reduce op created on this communicator; a no-op once
  // the communicator was aborted (which freed it).
  void destroyRedOp(ncclRedOp_t op) noexcept;

  // Whether [ptr, ptr + bytes) lies in a COLL_SYMMETRIC window of this
  // communicator (NCCL's one-sided calls read it in place).
  bool inSymmetricWindow(const void* ptr, size_t bytes);

  // The one listener (see CommunicatorListener); replaces any earlier one.
  void setListener(std::weak_ptr<CommunicatorListener> listener);

  void close(CommResource& resource) noexcept;

 private:
  Communicator(ncclComm_t comm, int rank, int size, Settings settings);
  static std::shared_ptr<Communicator>
  adopt(ncclComm_t comm, int rank, int size, Settings settings);
  // A communicator `make(parent, &child)` derives from this one through
  // `call`: made under a Use, settled by the parent's config, then owned.
  // Null when `make` leaves this rank out.
  std::shared_ptr<Communicator> derive(
      const char* call,
      const ncclConfig_t& config,
      std::string label,
      c10::function_ref<ncclResult_t(ncclComm_t, ncclComm_t*)> make);
  // Waits, on a nonblocking communicator, until the grow that made it
  // settled (up to the timeout, then aborts it); raises if it failed.
  void settleGrow(ncclResult_t result);
  [[noreturn]] void raiseAborted() const;
  // This communicator, or RuntimeError while it is suspended.
  Communicator& refuseWhileSuspended();
  void abort(CommunicatorListener* instead) noexcept;
  // ncclCommAbort, once: by abort() when no Use is held, else by the last
  // Use to end.
  void releaseHandle() noexcept;
  // Whether ncclCommRevoke may run (see stopKernels).
  bool canRevoke() const;
  // ncclCommRevoke on the handle, which must be alive; once at most, and
  // never after a finalize: false where it did not call it.
  bool revokeHandle() noexcept;
  // ncclCommFinalize on a blocking communicator, waited for up to the
  // timeout (see flush).
  bool finalizeBlocking() noexcept;

  // Polls a nonblocking communicator until NCCL finished `call`. At the
  // timeout it aborts the communicator (which ends NCCL's pending job, so it
  // cannot write to the caller's output later) and throws.
  ncclResult_t settle(const char* call);
  // The state NCCL reaches within the timeout; nullopt if it is still
  // ncclInProgress then.
  std::optional<ncclResult_t> pollUntilSettled();
  // ncclCommWindowRegister, settled; null where the platform has no windows.
  // Collective.
  ncclWindow_t windowRegister(void* ptr, size_t bytes, int flags);
  // The LoadStore engine's state for a new window: the signal window
  // (collective, with the first window) and the window's peer addresses, read
  // now because reading them cannot be captured in a CUDA graph.
  void prepareLoadStore(const Window& window);
  // The window of this communicator covering [ptr, ptr + bytes); needs
  // mutex_.
  Window* windowCovering(const void* ptr, size_t bytes, int flags) const;
  template <typename Resource, typename... Args>
  std::shared_ptr<Resource> track(Args&&... args);
  void onFree(const Allocation& allocation) noexcept override;

  const NcclApi* const api_;
  ncclComm_t comm_;
  const int rank_;
  const int size_;
  const int device_;
  const bool nonblocking_;
  std::atomic<std::chrono::milliseconds> timeout_;
  const std::string label_;
  // The config it was made with (strings owned here).
  const std::string netName_;
  const std::string commName_;
  ncclConfig_t config_;
  std::atomic<bool> aborted_{false};
  // The fence between Use and abort(): Dekker-style, so every access is
  // sequentially consistent.
  std::atomic<int> uses_{0};
  std::atomic<bool> releaseRequested_{false};
  std::atomic<int> hostCalls_{0}; // HostCalls in progress
  std::atomic<bool> released_{false};
  // ncclCommFinalize or ncclCommRevoke was called: NCCL takes neither again
  // (both set its finalizeCalled; init.cc).
  std::atomic<bool> finalizing_{false};
  CapturedGraphs capturedGraphs_;
  // Serialises suspend() and resume(); suspended_ is read without it.
  std::mutex suspendMutex_;
  std::atomic<bool> suspended_{false};

  // Held through abort(), listener included.
  std::mutex abortMutex_;
  // Guards the aborted state and the resource tables; never held across a
  // collective.
  std::mutex mutex_;
  // Serialises ncclCommGetAsyncError between the watchdog and settle(): on
  // a nonblocking communicator it may complete NCCL's pending job.
  mutable std::mutex pollMutex_;
  std::unordered_map<const CommResource*, std::shared_ptr<CommResource>>
      resources_;
  std::vector<Window*> windows_; // the windows among resources_
  std::weak_ptr<CommunicatorListener> listener_;
  // Declared last: destroyed after the destructor's abort released its
  // window.
  std::unique_ptr<SignalWindow> signalWindow_;
};

} // namespace nccl_core

// The nccl_core c10d::Backend, the c10d adapter: one NCCL communicator per
// group. Every op checks its arguments (ops/arguments.h) and hands its NCCL
// calls (ops/nccl_calls.h) to the group's op runner (op_runner.h), which
// picks the stream, enqueues them and returns Work; the ranks' agreements in
// the store live in group_agreement.h.
#pragma once

#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/FunctionRef.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/headeronly/version.h>

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/group_agreement.h"
#include "backend/op_runner.h"
#include "backend/options.h"
#include "backend/routing/comm_routes.h"
#include "backend/runtime/ephemeral_timeouts.h"
#include "backend/runtime/event_pool.h"
#include "backend/runtime/failure.h"
#include "backend/runtime/hooks.h"
#include "backend/runtime/sync_ops.h"
#include "backend/runtime/watchdog.h"
#include "backend/runtime/work.h"
#include "nccl/communicator.h"
#include "nccl/one_sided.h"

// c10d::Backend::suspend, resume and getMemoryStats exist from torch 2.14 on.
#define NCCL_CORE_HAS_BACKEND_SUSPEND \
  (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 14)

namespace nccl_core {

// The c10d options torch.distributed reads back from a group (split_group
// copies them for the child); NCCL's own settings live in NcclCoreOptions.
struct GroupOptions : c10d::Backend::Options {
  GroupOptions(std::chrono::milliseconds timeout, std::string groupName)
      : c10d::Backend::Options("nccl_core", timeout) {
    group_name = std::move(groupName);
  }
};

#ifdef C10D_BACKEND_HAS_WINDOW
// One op of a torch Window toward `peer`: whether it waits for the peer (a
// wait_signal), whether it is async, its timeout, the tensors it reads.
struct WindowOp {
  const char* name;
  int peer;
  bool waits;
  bool asyncOp;
  std::chrono::milliseconds timeout;
  std::vector<at::Tensor> inputs;
};
#endif

// A group as one of its ranks takes part in it: the store its ranks meet in,
// this rank's number, how many they are, the group's name.
struct Membership {
  c10::intrusive_ptr<c10d::Store> store;
  int rank;
  int size;
  std::string name;
};

class NcclCoreBackend : public c10d::Backend, public OneSidedGroup {
 public:
  NcclCoreBackend(
      Membership member,
      std::shared_ptr<const NcclCoreOptions> options,
      std::chrono::milliseconds defaultTimeout,
      std::shared_ptr<Communicator> comm = nullptr,
      std::vector<int64_t> globalRanks = {});
  ~NcclCoreBackend() override;

  const std::string getBackendName() const override {
    return "nccl_core";
  }
  bool supportsSplitting() const override {
    return true;
  }
  bool supportsCoalescing() const override {
    return true;
  }

  // Communication buffers on NCCL memory, cached in a torch MemPool (FSDP2's
  // set_allocate_memory_from_process_group_for_comm asks for these).
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override;

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& outputSplits,
      std::vector<int64_t>& inputSplits,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work>
  send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work>
  recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work>
  recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work>
  barrier(const c10d::BarrierOptions& opts) override;

  void startCoalescing() override {
    runner_.startCoalescing();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    return runner_.endCoalescing();
  }

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    return runner_.seq();
  }

  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  bool supportsShrinking() const override {
    return true; // ncclCommShrink is in every NCCL this package loads on
  }
  // The group without `ranksToExclude` (torch.distributed.shrink_group),
  // through ncclCommShrink on the ranks that stay. NCCL_SHRINK_ABORT first
  // ends the ops in flight here, which leaves this group failed. A group
  // that failed already (a peer died) is re-formed: the ranks that stay make
  // a communicator of their own.
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude,
      int shrinkFlags,
      const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) override;

  // Elastic grow (backend/grow.cpp; NCCL >= 2.29's ncclCommGrow): this
  // group's ranks and processes that join() make a group of `newSize` ranks
  // named `name`, in which this group's ranks keep their numbers and the
  // others take the rest. Collective over this group; `store` is the new
  // group's, the same in every process. The ranks meet in it first, bounded
  // by the group's timeout (a rank that never came is named); NCCL's grow is
  // bounded on a nonblocking group only. A failure past the meeting fails
  // this group.
  c10::intrusive_ptr<NcclCoreBackend> grow(
      const c10::intrusive_ptr<c10d::Store>& store,
      int newSize,
      std::string name);
  // A new process's part in a grow, as `member`, on CUDA device `device`,
  // waiting up to `timeout` for the group to start; the grown group takes the
  // group's timeout. ValueError where the rank is one the growing group has,
  // or another process took, or the size is not the group's new size.
  static c10::intrusive_ptr<NcclCoreBackend> join(
      Membership member,
      std::shared_ptr<const NcclCoreOptions> options,
      std::chrono::milliseconds timeout,
      int device);
  void eagerConnectSingleDevice(at::Device device) override;
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  c10d::ErrorType getError() override;
  // The timeout of ops issued from now on, of synchronous ops in flight, and
  // of the communicator's later nonblocking calls (dist.set_timeout).
  void setTimeout(std::chrono::milliseconds timeout) override;
#if NCCL_CORE_HAS_EPHEMERAL_TIMEOUTS
  // Lengthens the timeout of the ops issued until the next one finished
  // (backend/runtime/ephemeral_timeouts.h); torch.compile's cache hits call it.
  void addEphemeralTimeout(const std::chrono::milliseconds& timeout) override {
    ephemeral_->add(timeout, runner_.seq() + 1);
  }
#endif
  // Times every op issued from now on (Work.get_duration), as
  // TORCH_NCCL_ENABLE_TIMING=1 does from the start.
  void enableCollectivesTiming() override {
    runner_.enableTiming();
  }
#ifdef C10D_BACKEND_HAS_HOOKS
  // Run by the watchdog before it aborts the group on a timeout, an NCCL
  // error or a peer's abort (not on abort() or shutdown()).
  void registerAbortHook(int64_t id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t id) override;
#endif
#if NCCL_CORE_HAS_COMPLETION_HOOKS
  bool supportsAbortHooks() const override {
    return true;
  }
  // Run by the watchdog when it sees an async op (or a coalesced block)
  // finish successfully; synchronous ops complete as they are issued.
  bool supportsCompletionHooks() const override {
    return true;
  }
  void registerCompletionHook(int64_t id, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t id) override;
#endif
#ifdef C10D_BACKEND_HAS_WINDOW
  // torch's one-sided API (torch.distributed._new_window) over this group's
  // windows (backend/ops/windows.h); `tensor`, if given, is registered with the
  // new window, collectively.
  bool supportsWindow() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Window>
  new_window(const std::optional<at::Tensor>& tensor) override;
#endif
  void abort() override;
  void shutdown() override;

  // NCCL's suspend of the group's communicators (backend/suspend.cpp,
  // NCCL >= 2.29.7): suspendGroup() releases what NCCL can release once every
  // op of the group finished, and ops are refused until resumeGroup()
  // restores it; both collective (every rank calls them, in the same order)
  // and idempotent. groupMemoryStats() reads NCCL's memory of them, under the
  // keys torch's own NCCL backend uses.
  // Registers the segments torch's allocator holds now in memory pool `pool`
  // with the group's communicator (torch's ProcessGroupNCCL::registerMemPool;
  // backend/memory_pools.cpp); deregisterMemPool drops them, and torch's
  // free of a segment drops its registration first. ValueError: the pool is
  // registered already, is not registered, or holds memory of another device.
  void registerMemPool(c10::MempoolId_t pool);
  void deregisterMemPool(c10::MempoolId_t pool);
  // What the group holds registered, and what first-use registration cost.
  RegistrationStats registrationStats();

  void suspendGroup();
  void resumeGroup();
  std::unordered_map<std::string, uint64_t> groupMemoryStats();
#if NCCL_CORE_HAS_BACKEND_SUSPEND
  void suspend() override {
    suspendGroup();
  }
  void resume() override {
    resumeGroup();
  }
  std::unordered_map<std::string, uint64_t> getMemoryStats() override {
    return groupMemoryStats();
  }
#endif

  const NcclCoreOptions& options() const {
    return *options_;
  }
  // The communicator, created on first use; throws if the group failed.
  Communicator& communicator(at::Device device);
  // The communicator for Python (torch_nccl_core.communicator); `device`
  // defaults to the group's device.
  std::shared_ptr<Communicator>
  sharedCommunicator(std::optional<at::Device> device);
  // The window-free twin (CommRoutes), null before the first symmetric
  // window: for tests of routing.
  std::shared_ptr<Communicator> windowFreeTwin();

  // A one-sided op on the group's communicator (nccl/one_sided.h), from the
  // thread that runs the group's ops, run on `stream` as a synchronous op of
  // the group through the op runner: numbered, refused once the group failed,
  // timed by the watchdog outside stream capture, its errors naming it, its
  // peers, its number and the group.
  void runOneSided(
      const char* name,
      c10::ArrayRef<int> peers,
      bool waits,
      cudaStream_t stream,
      c10::function_ref<void()> enqueue) override;

 private:
  // One-sided operations do not coalesce (NCCL would defer them to the
  // block's ncclGroupEnd, while the load/store engine runs at once):
  // RuntimeError naming `op` inside a block, which then ends.
  void refuseInsideCoalescing(const char* op);
  // send (`sends`) or recv of a tensor with `peer` (backend/ops/
  // point_to_point.cpp).
  c10::intrusive_ptr<c10d::Work>
  pointToPoint(std::vector<at::Tensor>& tensors, int peer, bool sends);
  // gather (`toRoot`) or scatter of this rank's tensor in `mine` with the
  // root's per-rank `lists` (backend/ops/point_to_point.cpp).
  template <typename Opts>
  c10::intrusive_ptr<c10d::Work> exchangeWithRoot(
      std::vector<std::vector<at::Tensor>>& lists,
      std::vector<at::Tensor>& mine,
      const Opts& opts,
      bool toRoot);

#ifdef C10D_BACKEND_HAS_WINDOW
  friend class TorchWindow;
  // One op of a torch Window on `device` (backend/ops/windows.cpp): `enqueue`
  // puts it on the stream given, through the op runner, so it is numbered,
  // profiled and timed like the group's other ops.
  c10::intrusive_ptr<c10d::Work> runWindowOp(
      WindowOp op,
      at::Device device,
      c10::function_ref<void(cudaStream_t)> enqueue);
#endif

  // The communicator of an op on `tensor`, made by the group's first op on
  // the tensor's device, after checking that `tensor` is a CUDA tensor; then
  // checks that it is fit for NCCL on the communicator's device (`what`
  // names it in errors).
  Communicator&
  communicatorFor(const at::Tensor& tensor, const char* op, const char* what);

  // A group over `comm`, made from this one: its options, and the timeout
  // and name `opts` give. `members` are its ranks in this group.
  c10::intrusive_ptr<NcclCoreBackend> child(
      const c10::intrusive_ptr<c10d::Store>& store,
      std::shared_ptr<Communicator> comm,
      std::string name,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts,
      const std::vector<int>& members);
  // shrink() of a failed group: `members`, the ranks that stay, tear it
  // down and make a communicator of their own through the store, as at init
  // (`meeting`: the shrink's, whose keys the new one's extend).
  c10::intrusive_ptr<c10d::Backend> reform(
      const std::vector<int>& members,
      const std::string& meeting,
      std::string name,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts);
  // shrink's arguments, checked: the excluded ranks, sorted.
  std::vector<int> checkedExclusions(
      const std::vector<int64_t>& ranksToExclude,
      int shrinkFlags) const;
  void initCommunicator(at::Device device);
  // A communicator of `size` ranks, this one `rank`, on `device`, for group
  // `name`: the ranks meet in the store under `purpose` (meetings.h; this
  // rank gives the meeting up once `abandon` holds), then NCCL initializes it;
  // `started` sees it before its initialization ends.
  std::shared_ptr<Communicator> newCommunicator(
      const std::string& purpose,
      int rank,
      int size,
      int device,
      const std::string& name,
      const std::function<bool()>& abandon = {},
      const std::function<void(const std::shared_ptr<Communicator>&)>& started =
          {});
  void setupCommunicator(std::shared_ptr<Communicator> comm);
  at::Device deviceForOpWithoutTensors(const std::vector<int64_t>& deviceIds);
  void teardown(const std::string& reason);
  // teardown, for ranks that may be finalizing the group: they stop waiting
  // for this one (finalizeMeeting).
  void teardownWithoutFinalizing(const std::string& reason);
  // NCCL >= 2.32 ends ncclCommFinalize with a barrier of the communicator's
  // ranks on this host (commDestroySync), where a rank waits for ever for a
  // peer that aborted or never finalizes. The ranks meet in the store first,
  // bounded by the group's timeout, the watchdog stopped first, each saying
  // whether it can finalize (and has a twin): whether every one of them will.
  bool finalizeMeeting() noexcept;
  // Whether every enqueued op finished; true too when CUDA cannot say.
  bool idleOrBroken() noexcept;
  // The group's communicator and its window-free twin, those made so far.
  std::vector<std::shared_ptr<Communicator>> madeCommunicators();
  // Why this rank cannot suspend the group now; empty if it can.
  std::string suspendRefusal();
  // The ranks agree in the store that each can run the collective `op`;
  // RuntimeError on every rank if one cannot (`mine`: this rank's reason).
  void agreeToGoAhead(const char* op, const std::string& mine);
  // `call` on every communicator of the group, timed like an op; a failure
  // fails the group, but for NCCL's refusal before its barrier.
  void runSuspendCall(const char* op, void (Communicator::*call)());
  [[noreturn]] void
  failSuspendCall(const char* op, uint64_t seq, const std::string& cause);

  const std::shared_ptr<const std::string> groupName_;
  const std::shared_ptr<const NcclCoreOptions> options_;
  std::atomic<std::chrono::milliseconds> timeout_;
  // The group's ranks in the default group, and this
  // rank's: for the device of a group that is bound to none (rank % device
  // count, as torch's NCCL backend guesses) and the flight recorder.
  const std::vector<int64_t> globalRanks_;
  const int globalRank_;
  const size_t traceGroup_; // the group in the flight recorder

  std::shared_ptr<FailureState> failure_ = std::make_shared<FailureState>();
  // The ranks' meetings in the store (after timeout_ and failure_, which it
  // reads).
  GroupAgreement agreement_;
  const AgreeFn agreeOnUpgrade_ = [this](int64_t vote) {
    return agreement_.meetNext("window_upgrade", vote);
  };
  const std::shared_ptr<BackendHooks> hooks_ = std::make_shared<BackendHooks>();
  const std::shared_ptr<EphemeralTimeouts> ephemeral_ =
      std::make_shared<EphemeralTimeouts>();
  std::shared_ptr<Communicator> comm_;
  // comm_ is set up; until then threads meet under firstUseMutex_ to make it.
  std::atomic<bool> commReady_{false};
  std::mutex firstUseMutex_;
  // A communicator still initializing, for abort() from another thread; and
  // the guard of it and of watchdog_ between the two.
  std::mutex initMutex_;
  std::weak_ptr<Communicator> initializing_;
  // This rank came to the finalize meeting, or gave it up (finalizeMeeting).
  std::atomic<bool> finalizeSettled_{false};
  // Orders setTimeout against the watchdog's creation (taken after
  // initMutex_ there).
  std::mutex timeoutMutex_;
  std::unique_ptr<Watchdog> watchdog_;
  // Sends the one-sided ops on comm_ through runOneSided.
  std::unique_ptr<OneSidedLink> oneSidedLink_;
  at::Tensor barrierToken_;
  // TORCH_NCCL_CORE_AUTO_REGISTER (default on): register NCCL memory that
  // ops touch.
  const bool autoRegister_;
  // Options.register_caching_allocator, where torch's allocator is one whose
  // segments can be tracked.
  const bool registersSegments_;
  std::unique_ptr<at::cuda::MemPool> memPool_; // for allocateTensor
  // The twin, the copy engine and automatic registration; made with the
  // communicator.
  std::shared_ptr<CommRoutes> routes_;
  // Where suspendGroup() stands: ops are refused unless Active.
  std::atomic<SuspendState> suspendState_{SuspendState::Active};
  // Memory pools registered (registerMemPool), with their registrations.
  std::mutex poolsMutex_;
  std::map<c10::MempoolId_t, std::vector<std::shared_ptr<RegisteredBuffer>>>
      pools_;

  // Every op's spine (op_runner.h): last, so that it goes first.
  OpRunner runner_;
};

} // namespace nccl_core

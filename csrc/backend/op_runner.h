// The one spine every op of a group runs through (op_runner.cpp), one-sided
// ops included: prepare() settles where the op runs (CommRoutes: the
// communicator, its twin or an engine), its number and timeout;
// beforeEnqueue() registers the NCCL memory routing found unregistered;
// runSync, runAsync and runCoalesced run it on the caller's stream or the
// group's internal one and hand back its Work. A coalescing block
// (startCoalescing to endCoalescing) ends as one more op of the spine:
// ncclGroupEnd, enqueued and checked as every op is, and one tracked Work.
// NcclCoreBackend holds one and hands it each op, as PyTorch's c10d/nccl2
// splits the c10d surface (ProcessGroupNCCLBackend.cpp) from the engine
// (ProcessGroupNCCL.cpp).
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/ops/nccl_calls.h"
#include "backend/routing/comm_routes.h"
#include "backend/runtime/ephemeral_timeouts.h"
#include "backend/runtime/event_pool.h"
#include "backend/runtime/failure.h"
#include "backend/runtime/sync_ops.h"
#include "backend/runtime/watchdog.h"
#include "backend/runtime/work.h"

namespace nccl_core {

// The NCCL calls of one op (backend/ops/nccl_calls.h), given where they go.
using EnqueueFn = c10::function_ref<ncclResult_t(const NcclTarget&)>;

// What an op is, for launch(): its c10d type and name, the device it runs
// on, whether the caller gets async Work (else the lean synchronous path) and
// its timeout (kUnsetTimeout: the group's).
struct OpCall {
  c10d::OpType type;
  const char* name;
  at::Device device;
  bool asyncOp;
  std::chrono::milliseconds timeout;

  // An op with c10d options `opts` (asyncOp, timeout) on `tensor`'s device.
  template <typename Opts>
  static OpCall
  of(c10d::OpType type,
     const char* name,
     const at::Tensor& tensor,
     const Opts& opts) {
    return {type, name, tensor.device(), opts.asyncOp, opts.timeout};
  }
};

// How launch() may run an op beyond the defaults.
struct LaunchOptions {
  bool blocksHost = false; // wait() blocks the host (barrier)
  // A collective NCCL may give symmetric kernels: routing may move it to the
  // window-free twin (backend/routing/policy.h). Not for ops bound to one
  // communicator (custom reduce ops).
  bool routable = false;
  int peer = -1; // send and recv: the other rank, for the flight recorder
  // Whether the tensors it sends hold this rank's data (not on a broadcast's
  // other ranks, whose one tensor only receives): TORCH_NCCL_NAN_CHECK looks
  // at them.
  bool sendsData = true;
  // A one-sided op (torch's Window API): its peers, and whether it waits for
  // them, as the watchdog reports and treats it (SyncOpDetail).
  const SyncOpDetail* oneSided = nullptr;
  // Whether one of the backend's engines may run the op in NCCL's place
  // (backend/engines/engine.h), and its reduction, a built-in one.
  bool engines = false;
  std::optional<c10d::ReduceOp::RedOpType> reduction;

  static LaunchOptions withPeer(int peer) {
    LaunchOptions options;
    options.peer = peer;
    return options;
  }
  static LaunchOptions routed(bool routable = true) {
    LaunchOptions options;
    options.routable = routable;
    return options;
  }
  // A reduction by `op`, which NCCL has `builtin` (no custom op): routable,
  // and one for the backend's engines.
  static LaunchOptions reducing(const c10d::ReduceOp& op, bool builtin) {
    LaunchOptions options = routed(builtin);
    if (builtin) {
      options.engines = true;
      options.reduction = op.op_;
    }
    return options;
  }
  // A gather: routable, and one for the backend's engines.
  static LaunchOptions gathering() {
    LaunchOptions options = routed();
    options.engines = true;
    return options;
  }
  static LaunchOptions blockingHost() {
    LaunchOptions options;
    options.blocksHost = true;
    return options;
  }
};

// What launch() settled before running an op: where it runs (and what to
// register first), its number, timeout and the caller's stream.
struct OpPlan {
  OpInfo info;
  Route route;
  at::Device device;
  std::chrono::milliseconds timeout;
  c10::cuda::CUDAStream current;
  bool capturing;
  const SyncOpDetail* oneSided;               // LaunchOptions::oneSided
  std::optional<size_t> trace = std::nullopt; // its flight recorder entry
};

// Where suspendGroup() stands (backend/suspend.cpp): ops are refused unless
// Active.
enum class SuspendState : uint8_t { Active, Suspending, Suspended };

// What an op runner reads of its group, for the group's life.
struct RunnerGroup {
  const c10d::Backend& backend; // its rank, size and description
  std::shared_ptr<const std::string> name;
  size_t traceGroup; // the group in the flight recorder
  std::shared_ptr<FailureState> failure;
  std::shared_ptr<EphemeralTimeouts> ephemeral;
  const std::atomic<std::chrono::milliseconds>& timeout;
  const std::atomic<SuspendState>& suspend;
  const AgreeFn* agreeOnUpgrade; // the ranks' window-upgrade vote
  // The device of an op without tensors (an empty coalescing block's).
  std::function<at::Device()> defaultDevice;
};

// What ops run on, once the group's communicator is made.
struct RunnerParts {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CommRoutes> routes;
  Watchdog* watchdog; // the group's, which outlives the runner
  std::shared_ptr<EventPool> events;
  c10::cuda::CUDAStream stream; // internal, for async and coalesced ops
};

class OpRunner {
 public:
  // `nanCheck`: TORCH_NCCL_NAN_CHECK (ops that would send NaN refused);
  // `timing`: every op timed (TORCH_NCCL_ENABLE_TIMING).
  OpRunner(RunnerGroup group, bool nanCheck, bool timing);
  OpRunner(const OpRunner&) = delete;
  OpRunner& operator=(const OpRunner&) = delete;
  ~OpRunner();

  // Before this, ops cannot run (their checks make the communicator first).
  void attach(RunnerParts parts);

  // Runs `enqueue` for one op. Synchronous ops run on the current stream;
  // async (and coalesced) ones on the internal stream after the current one,
  // with the tensors kept alive until the op completes.
  c10::intrusive_ptr<c10d::Work> launch(
      const OpCall& call,
      std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> inputs,
      EnqueueFn enqueue,
      LaunchOptions launchOptions = {});

  void startCoalescing();
  // The block's one Work.
  c10::intrusive_ptr<c10d::Work> endCoalescing();
  // Ends a coalescing block left by an exception, raised by an op inside it
  // or by torch before the next startCoalescing (torch's _coalescing_manager
  // then never calls endCoalescing): ops queued in it run as one tracked Work
  // that the caller's stream waits for, and the group takes ops again. A
  // no-op outside a block. Never throws.
  void abandonCoalescing() noexcept;
  bool coalescing() const {
    return block_.has_value();
  }

  // The number of the last op.
  uint64_t seq() const {
    return seq_;
  }
  // The number of a group call that is timed like an op but enqueues
  // nothing (suspend, resume).
  uint64_t nextSeq() {
    return ++seq_;
  }
  // Times every op issued from now on (Work.get_duration).
  void enableTiming() {
    timing_.store(true, std::memory_order_relaxed);
  }

 private:
  // Routes the op (one look at its tensors) and numbers it.
  OpPlan prepare(
      const OpCall& call,
      const std::vector<at::Tensor>& outputs,
      const std::vector<at::Tensor>& inputs,
      LaunchOptions launchOptions);
  // Notes a capture (or drops retired Work outside one) and registers the
  // NCCL memory routing found unregistered.
  void beforeEnqueue(OpPlan& plan);
  c10::intrusive_ptr<c10d::Work> runSync(
      const OpPlan& plan,
      EnqueueFn enqueue,
      std::vector<at::Tensor> outputs);
  c10::intrusive_ptr<c10d::Work> runAsync(
      const OpPlan& plan,
      EnqueueFn enqueue,
      std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> inputs,
      bool blocksHost);
  c10::intrusive_ptr<c10d::Work> runCoalesced(
      const OpPlan& plan,
      EnqueueFn enqueue,
      std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> inputs);
  // Runs the op's NCCL calls (or its engine) on `stream`, made the current
  // one, as a host call the watchdog times, checked; a failure raises
  // DistBackendError naming the op, its number and the group, and the
  // group's failure where it failed.
  void enqueueChecked(
      const OpPlan& plan,
      EnqueueFn enqueue,
      const c10::cuda::CUDAStream& stream,
      OpTiming* timing = nullptr);
  // The Work of an op (or a coalesced block) enqueued on the internal
  // stream: it owns the event recorded there after it, keeps `stash` alive
  // until the event completes, and is tracked by the watchdog outside a
  // capture.
  c10::intrusive_ptr<c10d::Work> trackedWork(
      const OpPlan& plan,
      std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> stash,
      std::unique_ptr<OpTiming> timing,
      c10::ArrayRef<size_t> traces,
      bool blocksHost);
  // The internal stream waits for the caller's.
  void orderInternalStream(const OpPlan& plan);
  // Timing events for the op, when collectives timing is on.
  std::unique_ptr<OpTiming> timingFor(const OpPlan& plan) const;
  // A Work that owns no event: its op is ordered by the caller's stream, or
  // by the coalesced block's Work.
  c10::intrusive_ptr<NcclWork>
  eventlessWork(const OpPlan& plan, std::vector<at::Tensor> outputs);

  const RunnerGroup group_;
  const bool nanCheck_;
  std::atomic<bool> timing_;
  std::optional<RunnerParts> parts_;
  EventPool::Event ready_; // reused to order the internal stream
  uint64_t seq_ = 0;

  // A coalescing block (one NCCL group spanning several ops), open from
  // startCoalescing to endCoalescing.
  struct CoalescedBlock {
    uint64_t firstSeq = 0; // the number of the block's first op
    // Set once an op opened the NCCL group: it keeps the communicator from
    // being freed until ncclGroupEnd returned (Communicator::Use).
    std::optional<Communicator::Use> group;
    std::optional<at::Device> device;
    std::vector<at::Tensor> tensors; // kept alive by the block's Work
    std::unique_ptr<OpTiming> timing;
    std::vector<size_t> traces; // flight recorder ids of the block's ops
  };
  std::optional<CoalescedBlock> block_;
};

// Placed first in every op: if the op raises inside a coalescing block, the
// block ends (OpRunner::abandonCoalescing).
class EndCoalescingOnError {
 public:
  explicit EndCoalescingOnError(OpRunner& runner)
      : runner_(runner.coalescing() ? &runner : nullptr),
        uncaught_(runner_ ? std::uncaught_exceptions() : 0) {}
  EndCoalescingOnError(const EndCoalescingOnError&) = delete;
  EndCoalescingOnError& operator=(const EndCoalescingOnError&) = delete;
  ~EndCoalescingOnError() {
    if (runner_ && std::uncaught_exceptions() > uncaught_) {
      runner_->abandonCoalescing();
    }
  }

 private:
  OpRunner* const runner_;
  const int uncaught_;
};

} // namespace nccl_core

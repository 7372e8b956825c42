// OpRunner (op_runner.h): the spine every op runs through.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Logging.h>

#include "backend/op_runner.h"
#include "backend/ops/nan_check.h"
#include "backend/runtime/flight_recorder.h"
#include "backend/runtime/op_profile.h"
#include "backend/runtime/op_timing.h"
#include "nccl/api.h"
#include "nccl/errors.h"
#include "nccl/stream_ordered_free.h"

namespace nccl_core {

namespace {

bool isCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// An op as its errors name it: "nccl_core put_signal (seq 5, peer 1) on
// group 'g'"; without a number where it has none yet.
std::string opLabel(
    const char* name,
    std::optional<uint64_t> seq,
    const SyncOpDetail* oneSided,
    const std::string& group) {
  const std::string peers =
      oneSided ? describePeers(*oneSided) : ""; // ", peer 1"
  std::string numbered =
      seq ? c10::str("seq ", *seq, peers) : peers.substr(peers.empty() ? 0 : 2);
  return c10::str(
      "nccl_core ",
      name,
      numbered.empty() ? "" : c10::str(" (", numbered, ")"),
      " on group '",
      group,
      "'");
}

// Raises DistBackendError for the op `label` names, which failed with
// `error`: the group's failure where it has one, else `error`.
[[noreturn]] void raiseOpFailure(
    const std::string& label,
    const FailureState& failure,
    const c10::DistBackendError& error) {
  C10_THROW_ERROR(
      DistBackendError,
      opFailure(
          label,
          failure.failed() ? failure.message()
                           : error.what_without_backtrace()));
}

} // namespace

OpRunner::OpRunner(RunnerGroup group, bool nanCheck, bool timing)
    : group_(std::move(group)), nanCheck_(nanCheck), timing_(timing) {}

OpRunner::~OpRunner() = default;

void OpRunner::attach(RunnerParts parts) {
  ready_ = parts.events->acquire();
  parts_.emplace(std::move(parts));
}

void OpRunner::enqueueChecked(
    const OpPlan& plan,
    EnqueueFn enqueue,
    const c10::cuda::CUDAStream& stream,
    OpTiming* timing) {
  // The op's calls go to `stream`, and so do the copies and temporaries they
  // make (NcclTarget).
  const c10::cuda::CUDAStreamGuard onStream(stream);
  try {
    // Captured, NCCL only records the op: the watchdog stays out of a capture.
    std::optional<Watchdog::Enqueueing> timed;
    if (!plan.capturing) {
      timed.emplace(
          *parts_->watchdog, plan.info.name, plan.info.seq, plan.timeout);
    }
    const Communicator::HostCall call(plan.route.comm);
    if (timing) {
      timing->start.record(stream);
    }
    if (plan.route.engine) {
      plan.route.engine(stream.stream());
    } else {
      const NcclTarget to{plan.route.comm, call.handle(), stream.stream()};
      plan.route.comm.check(enqueue(to), plan.info.name);
    }
    if (timing) {
      timing->end.record(stream);
    }
  } catch (const c10::DistBackendError& e) {
    raiseOpFailure(
        opLabel(plan.info.name, plan.info.seq, plan.oneSided, *group_.name),
        *group_.failure,
        e);
  }
}

c10::intrusive_ptr<c10d::Work> OpRunner::launch(
    const OpCall& call,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs,
    EnqueueFn enqueue,
    LaunchOptions launchOptions) {
  // The op's argument checks made the communicator, which attached parts_.
  TORCH_INTERNAL_ASSERT(parts_, "an op ran before its group's communicator");
  // Every CUDA and NCCL call of the op on its communicator's device, whatever
  // the caller's current device is.
  const c10::cuda::CUDAGuard deviceGuard(call.device);
  if (nanCheck_ && launchOptions.sendsData &&
      !isCapturing(c10::cuda::getCurrentCUDAStream(call.device.index()))) {
    refuseNan(
        call.name, sentTensors(call.type, outputs, inputs)); // before numbering
  }
  OpPlan plan = prepare(call, outputs, inputs, launchOptions);
  // From here on under the op's profiler range: registration can take long.
  const OpProfile profile(
      plan.info,
      *group_.name,
      group_.backend.getRank(),
      group_.backend.getSize(),
      launchOptions.peer,
      inputs,
      outputs);
  beforeEnqueue(plan);
  const bool sync = !block_ && !call.asyncOp && !launchOptions.blocksHost;
  // A captured op runs when the graph is replayed, untracked. One-sided ops
  // stay out, as the Communicator API's do: torch's analyzer pairs
  // point-to-point entries as sends and receives.
  if (!plan.capturing && launchOptions.oneSided == nullptr) {
    plan.trace = FlightRecorder::process().record(
        group_.traceGroup,
        group_.backend.getGroupDesc(),
        TracedOp{
            call.name,
            plan.info.seq,
            sync,
            plan.timeout,
            group_.backend.getRank(),
            launchOptions.peer},
        inputs,
        outputs);
  }
  if (block_) {
    return runCoalesced(plan, enqueue, std::move(outputs), std::move(inputs));
  }
  if (sync) {
    return runSync(plan, enqueue, std::move(outputs));
  }
  return runAsync(
      plan,
      enqueue,
      std::move(outputs),
      std::move(inputs),
      launchOptions.blocksHost);
}

OpPlan OpRunner::prepare(
    const OpCall& call,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    LaunchOptions launchOptions) {
  if (C10_UNLIKELY(group_.failure->failed())) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str(
            opLabel(
                call.name, std::nullopt, launchOptions.oneSided, *group_.name),
            ": ",
            group_.failure->message()));
  }
  NCCL_CORE_CHECK_STATE(
      group_.suspend.load(std::memory_order_relaxed) == SuspendState::Active,
      call.name,
      "group '",
      *group_.name,
      "' is suspended (NCCL released its memory) or being suspended; "
      "resume() it first");
  const c10::cuda::CUDAStream current =
      c10::cuda::getCurrentCUDAStream(call.device.index());
  const bool capturing = isCapturing(current.stream());
  Route route = parts_->routes->route(
      RouteQuery{
          call.type,
          outputs,
          inputs,
          launchOptions.routable,
          launchOptions.engines,
          launchOptions.reduction,
          capturing,
          block_.has_value(),
          group_.agreeOnUpgrade});
  const SyncOpDetail* oneSided = launchOptions.oneSided;
  return OpPlan{
      OpInfo{call.type, call.name, ++seq_, oneSided && oneSided->waitsOnPeers},
      std::move(route),
      call.device,
      (call.timeout == c10d::kUnsetTimeout ? group_.timeout.load()
                                           : call.timeout) +
          group_.ephemeral->active(),
      current,
      capturing,
      oneSided};
}

void OpRunner::beforeEnqueue(OpPlan& plan) {
  if (plan.capturing) {
    // Counted before NCCL makes the graph's plan, so that an abort racing
    // this op already knows to leave NCCL's wait for the graph to a thread.
    // One-sided ops count their own: the load/store engine makes no plan.
    if (plan.oneSided == nullptr) {
      plan.route.comm.noteCapture(plan.current.stream());
    }
  } else {
    // Not under capture: freeing NCCL memory there would invalidate it.
    parts_->watchdog->reapRetired();
    freeFinished(/*wait=*/false); // NCCL memory freed while still in use
  }
  if (!plan.route.toRegister.empty()) {
    parts_->routes->registerMemory(plan.route);
  }
}

c10::intrusive_ptr<c10d::Work> OpRunner::runSync(
    const OpPlan& plan,
    EnqueueFn enqueue,
    std::vector<at::Tensor> outputs) {
  // Lean path: the caller's stream already orders everything.
  std::unique_ptr<OpTiming> timing = timingFor(plan);
  enqueueChecked(plan, enqueue, plan.current, timing.get());
  if (!plan.capturing) {
    parts_->watchdog->noteSyncOp(
        plan.current.stream(), plan.info.name, plan.info.seq, plan.oneSided);
  }
  auto work = eventlessWork(plan, std::move(outputs));
  work->setTiming(std::move(timing));
  return work;
}

c10::intrusive_ptr<c10d::Work> OpRunner::runAsync(
    const OpPlan& plan,
    EnqueueFn enqueue,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs,
    bool blocksHost) {
  std::unique_ptr<OpTiming> timing = timingFor(plan);
  orderInternalStream(plan);
  enqueueChecked(plan, enqueue, parts_->stream, timing.get());
  inputs.insert(inputs.end(), outputs.begin(), outputs.end());
  std::vector<size_t> traces;
  if (plan.trace) {
    traces.push_back(*plan.trace);
  }
  return trackedWork(
      plan,
      std::move(outputs),
      std::move(inputs),
      std::move(timing),
      traces,
      blocksHost);
}

c10::intrusive_ptr<c10d::Work> OpRunner::trackedWork(
    const OpPlan& plan,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> stash,
    std::unique_ptr<OpTiming> timing,
    c10::ArrayRef<size_t> traces,
    bool blocksHost) {
  WorkSpec spec{plan.info, plan.device, group_.name, plan.timeout};
  spec.end = parts_->events->acquire();
  C10_CUDA_CHECK(cudaEventRecord(spec.end.get(), parts_->stream.stream()));
  spec.outputs = std::move(outputs);
  spec.stash = std::move(stash);
  spec.blocksHost = blocksHost;
  auto work = c10::make_intrusive<NcclWork>(std::move(spec));
  work->setTiming(std::move(timing));
  work->addTraces(traces);
  if (!plan.capturing) {
    parts_->watchdog->track(work);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> OpRunner::runCoalesced(
    const OpPlan& plan,
    EnqueueFn enqueue,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs) {
  CoalescedBlock& block = *block_;
  const bool opensBlock = !block.group;
  if (opensBlock) {
    block.group.emplace(plan.route.comm);
    const ncclResult_t started = plan.route.comm.api().groupStart();
    if (started != ncclSuccess) {
      block.group.reset();
      plan.route.comm.check(started, "ncclGroupStart");
    }
    block.device = plan.device;
  }
  orderInternalStream(plan);
  if (opensBlock) {
    // The block is timed as one op: its kernels start at ncclGroupEnd.
    block.timing = timingFor(plan);
    if (block.timing) {
      block.timing->start.record(parts_->stream);
    }
  }
  enqueueChecked(plan, enqueue, parts_->stream);
  if (plan.trace) {
    block.traces.push_back(*plan.trace);
  }
  // The block's Work, returned by endCoalescing, owns the event and keeps
  // the tensors alive; this one only stands for the op inside it.
  block.tensors.insert(block.tensors.end(), inputs.begin(), inputs.end());
  block.tensors.insert(block.tensors.end(), outputs.begin(), outputs.end());
  return eventlessWork(plan, std::move(outputs));
}

void OpRunner::orderInternalStream(const OpPlan& plan) {
  C10_CUDA_CHECK(cudaEventRecord(ready_.get(), plan.current.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(parts_->stream.stream(), ready_.get(), 0));
}

std::unique_ptr<OpTiming> OpRunner::timingFor(const OpPlan& plan) const {
  // A captured event records no time.
  return timing_.load(std::memory_order_relaxed) && !plan.capturing
             ? std::make_unique<OpTiming>()
             : nullptr;
}

c10::intrusive_ptr<NcclWork>
OpRunner::eventlessWork(const OpPlan& plan, std::vector<at::Tensor> outputs) {
  WorkSpec spec{plan.info, plan.device, group_.name, plan.timeout};
  spec.outputs = std::move(outputs);
  return c10::make_intrusive<NcclWork>(std::move(spec));
}

void OpRunner::startCoalescing() {
  // A block still open was left by an exception outside this backend (torch's
  // own checks inside _coalescing_manager): end it rather than refuse forever.
  abandonCoalescing();
  block_.emplace();
  block_->firstSeq = seq_ + 1;
}

c10::intrusive_ptr<c10d::Work> OpRunner::endCoalescing() {
  NCCL_CORE_CHECK_STATE(
      block_, "endCoalescing", "called without startCoalescing()");
  CoalescedBlock block = std::move(*block_);
  block_.reset();
  const OpInfo info{
      c10d::OpType::COALESCED, "coalesced", seq_, false, block.firstSeq};
  const std::chrono::milliseconds timeout =
      group_.timeout.load() + group_.ephemeral->active();
  if (!block.group) {
    // Nothing was enqueued.
    return c10::make_intrusive<NcclWork>(
        WorkSpec{info, group_.defaultDevice(), group_.name, timeout});
  }
  const Communicator::Use group = std::move(*block.group);
  const c10::cuda::CUDAGuard deviceGuard(*block.device);
  // The block runs as one op of the group's communicator (routing keeps a
  // block's ops there) on the internal stream.
  const OpPlan plan{
      info,
      Route{*parts_->comm, {}, {}},
      *block.device,
      timeout,
      parts_->stream,
      isCapturing(parts_->stream.stream()),
      nullptr};
  // NCCL launches the block's kernels at ncclGroupEnd: under this range.
  const OpProfile profile(
      info,
      *group_.name,
      group_.backend.getRank(),
      group_.backend.getSize(),
      /*peer=*/-1,
      block.tensors,
      {});
  if (plan.capturing) {
    parts_->comm->noteCapture(
        parts_->stream.stream()); // before NCCL makes the plan
  }
  enqueueChecked(
      plan,
      [](const NcclTarget& to) {
        to.check(to.api().groupEnd(), "ncclGroupEnd");
        return ncclSuccess;
      },
      parts_->stream);
  if (block.timing) {
    block.timing->end.record(parts_->stream);
  }
  return trackedWork(
      plan,
      block.tensors,
      block.tensors,
      std::move(block.timing),
      block.traces,
      false);
}

void OpRunner::abandonCoalescing() noexcept {
  if (!block_) {
    return;
  }
  LOG(WARNING) << "[nccl_core] a coalescing block on group '" << *group_.name
               << "' was left by an exception; the block ends there"
               << (block_->group ? " and the ops queued before it run" : "");
  try {
    // Ordered before the caller's next work, as a waited Work would be.
    endCoalescing()->wait();
  } catch (const std::exception& e) {
    block_.reset();
    LOG(ERROR) << "[nccl_core] ending the coalescing block on group '"
               << *group_.name << "' failed: " << e.what();
  }
}

} // namespace nccl_core

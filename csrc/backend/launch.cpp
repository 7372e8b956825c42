// NcclCoreBackend::launch: the skeleton every op runs through, one-sided ones
// included. prepare() settles where it runs (CommRoutes: the communicator,
// its twin or an engine), its number and timeout; beforeEnqueue() registers
// the NCCL memory routing found unregistered; runSync, runAsync and
// runCoalesced run it.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "backend/launch.h"
#include "backend/ops/nan_check.h"
#include "backend/runtime/flight_recorder.h"
#include "backend/runtime/op_profile.h"
#include "backend/runtime/op_timing.h"
#include "nccl/api.h"
#include "nccl/errors.h"
#include "nccl/stream_ordered_free.h"

namespace nccl_core {

namespace {

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

// Runs an op's NCCL calls on the route's communicator, or an engine's in
// their place, as a host call the watchdog times (an abort revokes the
// communicator under it: NCCL may wait there for peers); a failure raises
// DistBackendError naming the op, its sequence number and its group, and the
// group's failure where the op failed because the group did.
void enqueueChecked(
    const OpPlan& plan,
    const std::string& group,
    const FailureState& failure,
    Watchdog& watchdog,
    EnqueueFn enqueue,
    const c10::cuda::CUDAStream& stream,
    OpTiming* timing = nullptr) {
  try {
    // Captured, NCCL only records the op: the watchdog stays out of a capture.
    std::optional<Watchdog::Enqueueing> timed;
    if (!plan.capturing) {
      timed.emplace(watchdog, plan.info.name, plan.info.seq, plan.timeout);
    }
    const Communicator::HostCall call(plan.route.comm);
    if (timing) {
      timing->start.record(stream);
    }
    if (plan.route.engine) {
      plan.route.engine(stream.stream());
    } else {
      plan.route.comm.check(
          enqueue(plan.route.comm.api(), call.handle(), stream.stream()),
          plan.info.name);
    }
    if (timing) {
      timing->end.record(stream);
    }
  } catch (const c10::DistBackendError& e) {
    raiseOpFailure(
        opLabel(plan.info.name, plan.info.seq, plan.oneSided, group),
        failure,
        e);
  }
}

} // namespace

void raiseOpFailure(
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

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::launch(
    const OpCall& call,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs,
    EnqueueFn enqueue,
    LaunchOptions launchOptions) {
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
      *groupName_,
      getRank(),
      getSize(),
      launchOptions.peer,
      inputs,
      outputs);
  beforeEnqueue(plan);
  const bool sync = !coalescing_ && !call.asyncOp && !launchOptions.blocksHost;
  // A captured op runs when the graph is replayed, untracked. One-sided ops
  // stay out, as the Communicator API's do: torch's analyzer pairs
  // point-to-point entries as sends and receives.
  if (!plan.capturing && launchOptions.oneSided == nullptr) {
    plan.trace = FlightRecorder::process().record(
        traceGroup_,
        getGroupDesc(),
        TracedOp{
            call.name,
            plan.info.seq,
            sync,
            plan.timeout,
            getRank(),
            launchOptions.peer},
        inputs,
        outputs);
  }
  if (coalescing_) {
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

OpPlan NcclCoreBackend::prepare(
    const OpCall& call,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    LaunchOptions launchOptions) {
  // The op's argument checks made the communicator (and routes_).
  if (C10_UNLIKELY(failure_->failed())) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str(
            opLabel(
                call.name, std::nullopt, launchOptions.oneSided, *groupName_),
            ": ",
            failure_->message()));
  }
  NCCL_CORE_CHECK_STATE(
      offloadState_.load(std::memory_order_relaxed) == OffloadState::Active,
      call.name,
      "group '",
      *groupName_,
      "' is suspended (NCCL released its memory) or being suspended; "
      "resume() it first");
  const c10::cuda::CUDAStream current =
      c10::cuda::getCurrentCUDAStream(call.device.index());
  const bool capturing = isCapturing(current.stream());
  Route route = routes_->route(
      RouteQuery{
          call.type,
          outputs,
          inputs,
          launchOptions.routable,
          launchOptions.engines,
          launchOptions.reduction,
          capturing,
          coalescing_,
          &agreeOnUpgrade_});
  const SyncOpDetail* oneSided = launchOptions.oneSided;
  return OpPlan{
      OpInfo{call.type, call.name, ++seq_, oneSided && oneSided->waitsOnPeers},
      std::move(route),
      call.device,
      (call.timeout == c10d::kUnsetTimeout ? timeout_.load() : call.timeout) +
          ephemeral_->active(),
      current,
      capturing,
      oneSided};
}

void NcclCoreBackend::beforeEnqueue(OpPlan& plan) {
  if (plan.capturing) {
    // Counted before NCCL makes the graph's plan, so that an abort racing
    // this op already knows to leave NCCL's wait for the graph to a thread.
    // One-sided ops count their own: the load/store engine makes no plan.
    if (plan.oneSided == nullptr) {
      plan.route.comm.noteCapture(plan.current.stream());
    }
  } else {
    // Not under capture: freeing NCCL memory there would invalidate it.
    watchdog_->reapRetired();
    freeFinished(/*wait=*/false); // NCCL memory freed while still in use
  }
  if (!plan.route.toRegister.empty()) {
    routes_->registerMemory(plan.route);
  }
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::runSync(
    const OpPlan& plan,
    EnqueueFn enqueue,
    std::vector<at::Tensor> outputs) {
  // Lean path: the caller's stream already orders everything.
  std::unique_ptr<OpTiming> timing = timingFor(plan);
  enqueueChecked(
      plan,
      *groupName_,
      *failure_,
      *watchdog_,
      enqueue,
      plan.current,
      timing.get());
  if (!plan.capturing) {
    watchdog_->noteSyncOp(
        plan.current.stream(), plan.info.name, plan.info.seq, plan.oneSided);
  }
  auto work = eventlessWork(plan, std::move(outputs));
  work->setTiming(std::move(timing));
  return work;
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::runAsync(
    const OpPlan& plan,
    EnqueueFn enqueue,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs,
    bool blocksHost) {
  std::unique_ptr<OpTiming> timing = timingFor(plan);
  orderInternalStream(plan);
  enqueueOnInternalStream(plan, enqueue, timing.get());
  inputs.insert(inputs.end(), outputs.begin(), outputs.end());
  EventPool::Event end = events_->acquire();
  C10_CUDA_CHECK(cudaEventRecord(end.get(), stream_->stream()));
  auto work = c10::make_intrusive<NcclWork>(
      plan.info,
      plan.device,
      groupName_,
      std::move(end),
      plan.timeout,
      std::move(outputs),
      std::move(inputs),
      blocksHost);
  work->setTiming(std::move(timing));
  if (plan.trace) {
    work->addTraces(*plan.trace);
  }
  if (!plan.capturing) {
    watchdog_->track(work);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::runCoalesced(
    const OpPlan& plan,
    EnqueueFn enqueue,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs) {
  const bool opensBlock = !coalescedGroup_;
  if (opensBlock) {
    coalescedGroup_.emplace(plan.route.comm);
    const ncclResult_t started = plan.route.comm.api().groupStart();
    if (started != ncclSuccess) {
      coalescedGroup_.reset();
      throwNcclError(started, "ncclGroupStart", __FILE__, __LINE__);
    }
    coalescedDevice_ = plan.device;
  }
  orderInternalStream(plan);
  if (opensBlock) {
    // The block is timed as one op: its kernels start at ncclGroupEnd.
    coalescedTiming_ = timingFor(plan);
    if (coalescedTiming_) {
      coalescedTiming_->start.record(*stream_);
    }
  }
  enqueueOnInternalStream(plan, enqueue);
  if (plan.trace) {
    coalescedTraces_.push_back(*plan.trace);
  }
  // The block's Work, returned by endCoalescing, owns the event and keeps
  // the tensors alive; this one only stands for the op inside it.
  coalescedTensors_.insert(
      coalescedTensors_.end(), inputs.begin(), inputs.end());
  coalescedTensors_.insert(
      coalescedTensors_.end(), outputs.begin(), outputs.end());
  return eventlessWork(plan, std::move(outputs));
}

void NcclCoreBackend::orderInternalStream(const OpPlan& plan) {
  C10_CUDA_CHECK(cudaEventRecord(ready_.get(), plan.current.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream_->stream(), ready_.get(), 0));
}

void NcclCoreBackend::enqueueOnInternalStream(
    const OpPlan& plan,
    EnqueueFn enqueue,
    OpTiming* timing) {
  // Temporaries made while enqueueing belong to the internal stream.
  const c10::cuda::CUDAStreamGuard guard(*stream_);
  enqueueChecked(
      plan, *groupName_, *failure_, *watchdog_, enqueue, *stream_, timing);
}

std::unique_ptr<OpTiming> NcclCoreBackend::timingFor(const OpPlan& plan) const {
  // A captured event records no time.
  return timing_.load(std::memory_order_relaxed) && !plan.capturing
             ? std::make_unique<OpTiming>()
             : nullptr;
}

c10::intrusive_ptr<NcclWork> NcclCoreBackend::eventlessWork(
    const OpPlan& plan,
    std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<NcclWork>(
      plan.info,
      plan.device,
      groupName_,
      EventPool::Event{},
      plan.timeout,
      std::move(outputs),
      std::vector<at::Tensor>{},
      false);
}

} // namespace nccl_core

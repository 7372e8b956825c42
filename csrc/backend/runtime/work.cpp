#include "backend/runtime/work.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/env.h>

#include <thread>

#include "backend/runtime/op_timing.h"

namespace nccl_core {

namespace {
bool blockingWaitFromEnv() {
  static const bool enabled =
      c10::utils::check_env("TORCH_NCCL_CORE_BLOCKING_WAIT") == true;
  return enabled;
}
} // namespace

const std::vector<at::Tensor>& sentTensors(
    c10d::OpType type,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs) {
  switch (type) {
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED:
    case c10d::OpType::BROADCAST:
    case c10d::OpType::REDUCE:
      return outputs;
    default:
      return inputs;
  }
}

NcclWork::~NcclWork() = default;

void NcclWork::setTiming(std::unique_ptr<OpTiming> timing) {
  timing_ = std::move(timing);
}

bool NcclWork::gpuDone() const {
  if (!end_) {
    return true;
  }
  cudaError_t status = cudaEventQuery(end_.get());
  if (status == cudaErrorNotReady) {
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

bool NcclWork::isCompleted() {
  return failure_.failed() || gpuDone();
}

bool NcclWork::isSuccess() const {
  return !failure_.failed() && gpuDone();
}

std::exception_ptr NcclWork::exception() const {
  if (!failure_.failed()) {
    return nullptr;
  }
  try {
    failure_.raise();
  } catch (...) {
    return std::current_exception();
  }
}

void NcclWork::waitOnHost(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) {
    // Cannot block forever: at the op's timeout the watchdog aborts the
    // communicator, which ends the kernel and so completes the event.
    C10_CUDA_CHECK(cudaEventSynchronize(end_.get()));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  while (!gpuDone()) {
    failure_.raiseIfFailed();
    if (timeout != kNoTimeout &&
        std::chrono::steady_clock::now() - start > timeout) {
      C10_THROW_ERROR(
          DistBackendError,
          c10::str(
              "wait() caught collective operation timeout: ",
              describe(),
              " did not complete within ",
              timeout.count(),
              " ms"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

bool NcclWork::wait(std::chrono::milliseconds timeout) {
  if (end_ && (blocksHost_ || timeout != kNoTimeout || blockingWaitFromEnv())) {
    waitOnHost(timeout);
  }
  // A kernel that NCCL aborted also completes its event: the failure decides.
  failure_.raiseIfFailed();
  if (end_) {
    // On the op's device: its default stream's handle (0) names the current
    // device's, and callers need not have set_device to the group's.
    const c10::cuda::CUDAGuard deviceGuard(device_.index());
    C10_CUDA_CHECK(cudaStreamWaitEvent(
        c10::cuda::getCurrentCUDAStream(device_.index()).stream(),
        end_.get(),
        0));
  }
  return true;
}

void NcclWork::synchronize() {
  wait(kNoTimeout);
}

std::vector<at::Tensor> NcclWork::result() {
  return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> NcclWork::getFuture() {
  std::lock_guard<std::mutex> lock(futureMutex_);
  if (future_) {
    return future_;
  }
  // Built on first request so ops that never ask pay nothing. The future is
  // marked complete on a side stream that waits for this op: whoever waits on
  // the future is then ordered after the op, as if it had been built at launch.
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()),
      std::vector<c10::Device>{device_});
  if (failure_.failed()) {
    future_->setError(exception());
    return future_;
  }
  c10::cuda::CUDAGuard deviceGuard(device_.index());
  c10::cuda::CUDAStream sideStream =
      c10::cuda::getStreamFromPool(false, device_.index());
  if (end_) {
    C10_CUDA_CHECK(cudaStreamWaitEvent(sideStream.stream(), end_.get(), 0));
  } else {
    // A synchronous op ran on the current stream.
    cudaEvent_t ready = nullptr;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(
        ready, c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(sideStream.stream(), ready, 0));
    C10_CUDA_CHECK(cudaEventDestroy(ready));
  }
  c10::cuda::CUDAStreamGuard streamGuard(sideStream);
  future_->markCompleted(c10::IValue(outputs_));
  return future_;
}

uint64_t NcclWork::getSequencenumber() const {
  return info_.seq;
}

float NcclWork::getDuration() const {
  TORCH_CHECK(
      timing_,
      describe(),
      " was not timed: set TORCH_NCCL_ENABLE_TIMING=1 before the group is "
      "made to time its ops");
  TORCH_CHECK(
      !failure_.failed() && timing_->end.query(),
      describe(),
      " has not finished successfully: its duration is known once it has");
  return timing_->start.elapsed_time(timing_->end);
}

std::string NcclWork::describe() const {
  return c10::str(
      "nccl_core ",
      info_.name,
      " (seq ",
      info_.seq,
      ") on group '",
      *groupName_,
      "'");
}

void NcclWork::markFailed(const std::string& message) {
  failure_.set(opFailure(describe(), message));
}

void NcclWork::releaseStash() {
  stash_.clear();
}

} // namespace nccl_core

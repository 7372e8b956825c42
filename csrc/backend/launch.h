// NcclCoreBackend::launch: the skeleton every op runs through. Included by the
// files that define ops.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "backend/backend.h"
#include "backend/op_profile.h"
#include "backend/routing.h"
#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

inline bool isCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// An NCCL group that is closed on every exit path.
class NcclGroup {
 public:
  NcclGroup() {
    NCCL_CORE_CHECK(nccl().groupStart());
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) {
      NCCL_CORE_WARN(nccl().groupEnd());
    }
  }
  ncclResult_t end() {
    open_ = false;
    return nccl().groupEnd();
  }

 private:
  bool open_ = true;
};

// Runs an op's NCCL calls on `comm`, inside the communicator's abort fence;
// a failure raises DistBackendError naming the op, its sequence number and
// its group.
template <typename Enqueue>
void enqueueChecked(
    Communicator& comm,
    const OpInfo& info,
    const std::string& group,
    Enqueue& enqueue,
    cudaStream_t stream) {
  try {
    const Communicator::Use use = comm.use();
    comm.check(enqueue(use.handle(), stream), info.name);
  } catch (const c10::DistBackendError& e) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str(
            "nccl_core ",
            info.name,
            " (seq ",
            info.seq,
            ") on group '",
            group,
            "' failed: ",
            e.what_without_backtrace()));
  }
}

template <typename Enqueue>
c10::intrusive_ptr<c10d::Work> NcclCoreBackend::launch(
    c10d::OpType type,
    const char* name,
    at::Device device,
    bool asyncOp,
    std::chrono::milliseconds timeout,
    std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs,
    Enqueue&& enqueue,
    LaunchOptions launchOptions) {
  const bool blocksHost = launchOptions.blocksHost;
  // Every CUDA and NCCL call of the op on its communicator's device, whatever
  // the caller's current device is.
  const c10::cuda::CUDAGuard deviceGuard(device);
  Communicator& comm =
      launchOptions.routable && !coalescing_
          ? routeCollective(communicator(device), type, outputs, inputs)
          : communicator(device);
  const OpInfo info{type, name, ++seq_};
  const OpProfile profile(
      info, *groupName_, getRank(), getSize(), inputs, outputs);
  if (timeout == c10d::kUnsetTimeout) {
    timeout = timeout_.load();
  }
  const c10::cuda::CUDAStream current =
      c10::cuda::getCurrentCUDAStream(device.index());
  const bool capturing = isCapturing(current.stream());
  if (capturing) {
    // Counted before NCCL makes the graph's plan, so that an abort racing
    // this op already knows to leave NCCL's wait for the graph to a thread.
    comm.noteCapture(current.stream());
  } else {
    // Not under capture: freeing NCCL memory there would invalidate it.
    watchdog_->reapRetired();
  }
  if (autoRegister_ && registrationGains(type)) {
    for (const auto* tensors : {&outputs, &inputs}) {
      for (const at::Tensor& tensor : *tensors) {
        comm.registerAutomatically(tensor.data_ptr(), tensor.nbytes());
      }
    }
  }

  // A Work that owns no event: its op is ordered by the caller's stream, or
  // by the coalesced group's Work.
  const auto eventless = [&] {
    return c10::make_intrusive<NcclWork>(
        info,
        device,
        groupName_,
        EventPool::Event{},
        timeout,
        std::move(outputs),
        std::vector<at::Tensor>{},
        false);
  };

  if (!asyncOp && !coalescing_ && !blocksHost) {
    // Lean path: the caller's stream already orders everything.
    enqueueChecked(comm, info, *groupName_, enqueue, current.stream());
    if (!capturing) {
      watchdog_->noteSyncOp(current.stream(), name, info.seq);
    }
    return eventless();
  }

  if (coalescing_ && !coalescedGroup_) {
    coalescedGroup_.emplace(comm);
    const ncclResult_t started = nccl().groupStart();
    if (started != ncclSuccess) {
      coalescedGroup_.reset();
      throwNcclError(started, "ncclGroupStart", __FILE__, __LINE__);
    }
    coalescedDevice_ = device;
  }
  C10_CUDA_CHECK(cudaEventRecord(ready_.get(), current.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream_->stream(), ready_.get(), 0));
  {
    // Temporaries made while enqueueing belong to the internal stream.
    c10::cuda::CUDAStreamGuard guard(*stream_);
    enqueueChecked(comm, info, *groupName_, enqueue, stream_->stream());
  }
  inputs.insert(inputs.end(), outputs.begin(), outputs.end());
  if (coalescing_) {
    // The group's Work, returned by endCoalescing, owns the event; this one
    // only stands for the op inside it.
    coalescedTensors_.insert(
        coalescedTensors_.end(), inputs.begin(), inputs.end());
    return eventless();
  }
  EventPool::Event end = events_->acquire();
  C10_CUDA_CHECK(cudaEventRecord(end.get(), stream_->stream()));
  auto work = c10::make_intrusive<NcclWork>(
      info,
      device,
      groupName_,
      std::move(end),
      timeout,
      std::move(outputs),
      std::move(inputs),
      blocksHost);
  if (!capturing) {
    watchdog_->track(work);
  }
  return work;
}

} // namespace nccl_core

// NcclCoreBackend::launch: the skeleton every op runs through. Included by the
// files that define ops.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "backend/backend.h"
#include "backend/routing.h"
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
    NCCL_CORE_CHECK(ncclGroupStart());
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) {
      NCCL_CORE_WARN(ncclGroupEnd());
    }
  }
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

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
  if (timeout == c10d::kUnsetTimeout) {
    timeout = timeout_;
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
    comm.check(enqueue(comm.get(), current.stream()), name);
    if (!capturing) {
      watchdog_->noteSyncOp(current.stream(), name, info.seq);
    }
    return eventless();
  }

  if (coalescing_ && !coalescedGroupOpen_) {
    NCCL_CORE_CHECK(ncclGroupStart());
    coalescedGroupOpen_ = true;
    coalescedDevice_ = device;
  }
  C10_CUDA_CHECK(cudaEventRecord(ready_.get(), current.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream_->stream(), ready_.get(), 0));
  {
    // Temporaries made while enqueueing belong to the internal stream.
    c10::cuda::CUDAStreamGuard guard(*stream_);
    comm.check(enqueue(comm.get(), stream_->stream()), name);
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

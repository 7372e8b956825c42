#include "backend/runtime/event_pool.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace nccl_core {

void EventPool::Releaser::operator()(CUevent_st* event) const {
  std::lock_guard<std::mutex> lock(pool->mutex_);
  pool->free_.push_back(event);
}

EventPool::~EventPool() {
  if (free_.empty()) {
    return; // no event was made (or a test had no GPU)
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  for (cudaEvent_t event : free_) {
    C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
  }
}

EventPool::Event EventPool::acquire() {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      event = free_.back();
      free_.pop_back();
    }
  }
  if (event == nullptr) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  return Event(event, Releaser{shared_from_this()});
}

} // namespace nccl_core

#include "nccl/captured_graphs.h"

#include <c10/cuda/CUDAException.h>

namespace nccl_core {

namespace {
using Counter = std::shared_ptr<std::atomic<int>>;

// Runs on a CUDA thread when the graph is destroyed: no CUDA calls here.
void graphDestroyed(void* counter) {
  auto* live = static_cast<Counter*>(counter);
  (*live)->fetch_sub(1, std::memory_order_acq_rel);
  delete live;
}
} // namespace

void CapturedGraphs::note(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id, &graph));
  if (status != cudaStreamCaptureStatusActive ||
      lastCapture_.exchange(id, std::memory_order_acq_rel) == id) {
    return;
  }
  auto* counter = new Counter(live_);
  cudaUserObject_t object = nullptr;
  cudaError_t result = cudaUserObjectCreate(
      &object, counter, graphDestroyed, 1, cudaUserObjectNoDestructorSync);
  if (result != cudaSuccess) {
    delete counter;
    C10_CUDA_CHECK(result);
  }
  live_->fetch_add(1, std::memory_order_acq_rel);
  // The graph takes the only reference: CUDA runs graphDestroyed with it.
  result = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
  if (result != cudaSuccess) {
    C10_CUDA_CHECK_WARN(cudaUserObjectRelease(object, 1)); // uncounts it
    C10_CUDA_CHECK(result);
  }
}

} // namespace nccl_core

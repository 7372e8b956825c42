#include "nccl/captured_graphs.h"

#include <c10/cuda/CUDAException.h>

namespace nccl_core {

namespace {
using Owner = std::shared_ptr<void>;

// Runs on a CUDA thread when the graph is destroyed: no CUDA calls here.
void graphDestroyed(void* owner) {
  delete static_cast<Owner*>(owner);
}
} // namespace

std::optional<Capture> activeCapture(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  Capture capture{};
  C10_CUDA_CHECK(
      cudaStreamGetCaptureInfo(stream, &status, &capture.id, &capture.graph));
  if (status != cudaStreamCaptureStatusActive) {
    return std::nullopt;
  }
  return capture;
}

void keepUntilDestroyed(cudaGraph_t graph, std::shared_ptr<void> owner) {
  auto* kept = new Owner(std::move(owner));
  cudaUserObject_t object = nullptr;
  cudaError_t result = cudaUserObjectCreate(
      &object, kept, graphDestroyed, 1, cudaUserObjectNoDestructorSync);
  if (result != cudaSuccess) {
    delete kept;
    C10_CUDA_CHECK(result);
  }
  // The graph takes the only reference: CUDA runs graphDestroyed with it.
  result = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
  if (result != cudaSuccess) {
    C10_CUDA_CHECK_WARN(cudaUserObjectRelease(object, 1)); // releases it
    C10_CUDA_CHECK(result);
  }
}

void CapturedGraphs::note(cudaStream_t stream) {
  const std::optional<Capture> capture = activeCapture(stream);
  if (!capture || lastCapture_.exchange(
                      capture->id, std::memory_order_acq_rel) == capture->id) {
    return;
  }
  live_->fetch_add(1, std::memory_order_acq_rel);
  // Uncounted when the graph goes (or at once, where it could not take it).
  keepUntilDestroyed(
      capture->graph, std::shared_ptr<void>(nullptr, [live = live_](void*) {
        live->fetch_sub(1, std::memory_order_acq_rel);
      }));
}

} // namespace nccl_core

#include "backend/engines/staging.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <thread>

#include "nccl/communicator.h"

namespace nccl_core {

namespace {
cudaStream_t newStream() {
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}
} // namespace

Staging::Staging(Communicator& comm, size_t bytes)
    : buffer_(comm, bytes), device_(comm.device()) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  for (cudaStream_t& stream : streams_) {
    stream = newStream();
  }
}

Staging::~Staging() {
  // Work still queued completes first; the streams go afterwards.
  for (cudaStream_t stream : streams_) {
    C10_CUDA_CHECK_WARN(cudaStreamDestroy(stream));
  }
}

void Staging::drain(std::chrono::milliseconds limit) const noexcept {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (cudaStream_t stream : streams_) {
    while (cudaStreamQuery(stream) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

} // namespace nccl_core

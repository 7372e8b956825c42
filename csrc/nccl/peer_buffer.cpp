#include "nccl/peer_buffer.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "nccl/communicator.h"
#include "nccl/memory.h"
#include "nccl/window_pointers.h"

#include <thread>

namespace nccl_core {

namespace {
cudaStream_t newStream() {
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}
} // namespace

PeerBuffer::PeerBuffer(Communicator& comm, size_t bytes) : bytes_(bytes) {
  const auto device = static_cast<c10::DeviceIndex>(comm.device());
  c10::cuda::CUDAGuard guard(device);
  memory_ = ncclAllocator(device)->allocate(bytes);
  C10_CUDA_CHECK(cudaMemset(memory_.get(), 0, bytes));
  // Zeroed before any peer can write: registration below is collective, and
  // a peer may write as soon as it returns.
  C10_CUDA_CHECK(cudaDeviceSynchronize());
  const ncclWindow_t window = comm.registerInternalWindow(memory_.get(), bytes);
  const std::vector<uintptr_t> bases =
      lsaBases(comm, window, lsaTeam(comm).size);
  remote_.assign(comm.size(), 0);
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (auto lsaRank = lsaRankOf(comm, peer)) {
      remote_[peer] = bases.at(*lsaRank);
    }
  }
}

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

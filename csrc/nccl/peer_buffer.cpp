#include "nccl/peer_buffer.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "nccl/communicator.h"
#include "nccl/memory.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

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

} // namespace nccl_core

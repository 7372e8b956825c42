#include "backend/runtime/sync_ops.h"

#include <c10/cuda/CUDAException.h>

#include <algorithm>

namespace nccl_core {

std::string describePeers(const SyncOpDetail& detail) {
  if (detail.peerCount == 0) {
    return {};
  }
  std::string text = detail.peerCount == 1 ? ", peer " : ", peers ";
  const int shown = std::min(detail.peerCount, SyncOpDetail::kPeersShown);
  for (int i = 0; i < shown; ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(detail.peers[i]);
  }
  if (detail.peerCount > shown) {
    text += " and " + std::to_string(detail.peerCount - shown) + " more";
  }
  return text;
}

void CudaSpanEvents::record(const Event& event, cudaStream_t stream) {
  C10_CUDA_CHECK(cudaEventRecord(event.get(), stream));
}

bool CudaSpanEvents::finished(const Event& event) {
  const cudaError_t status = cudaEventQuery(event.get());
  if (status == cudaErrorNotReady) {
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

} // namespace nccl_core

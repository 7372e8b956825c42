#include "backend/sync_ops.h"

#include <c10/cuda/CUDAException.h>

namespace nccl_core {

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

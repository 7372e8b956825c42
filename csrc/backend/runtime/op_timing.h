// The GPU time of one op, measured when collectives timing is on
// (TORCH_NCCL_ENABLE_TIMING=1, or c10d::Backend::enableCollectivesTiming, as
// for torch's NCCL backend): Work::getDuration reads it. Off by default, where
// it costs one relaxed load per op.
#pragma once

#include <c10/cuda/CUDAEvent.h>

namespace nccl_core {

struct OpTiming {
  // Timing events (cudaEventDefault): the pool's events record no time.
  c10::cuda::CUDAEvent start{cudaEventDefault};
  c10::cuda::CUDAEvent end{cudaEventDefault};
};

} // namespace nccl_core

// What the files that define ops share beside NcclCoreBackend::launch
// (launch.cpp): an NCCL group closed on every exit path, the capture check.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "backend/backend.h"
#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

inline bool isCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Raises DistBackendError for the op `label` names, which failed with
// `error`: the group's failure where it has one, else `error`.
[[noreturn]] void raiseOpFailure(
    const std::string& label,
    const FailureState& failure,
    const c10::DistBackendError& error);

// An NCCL group that is closed on every exit path.
class NcclGroup {
 public:
  explicit NcclGroup(const NcclApi& api) : api_(api) {
    NCCL_CORE_CHECK(api_.groupStart());
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) {
      NCCL_CORE_WARN(api_.groupEnd());
    }
  }
  ncclResult_t end() {
    open_ = false;
    return api_.groupEnd();
  }

 private:
  const NcclApi& api_;
  bool open_ = true;
};

// The NCCL calls `call(i)` for i in [0, count), each of entry point `name`,
// fused into one NCCL group (one launch) that is closed on every exit path.
template <typename Index, typename Call>
ncclResult_t
inOneGroup(const NcclApi& api, const char* name, Index count, Call&& call) {
  NcclGroup group(api);
  for (Index i = 0; i < count; ++i) {
    const ncclResult_t result = call(i);
    if (C10_UNLIKELY(result != ncclSuccess)) {
      throwNcclError(result, name, __FILE__, __LINE__);
    }
  }
  return group.end();
}

} // namespace nccl_core

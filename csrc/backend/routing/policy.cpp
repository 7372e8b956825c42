#include "backend/routing/policy.h"

#include <c10/util/Exception.h>
#include <c10/util/env.h>

#include "nccl/errors.h"

namespace nccl_core {

SymmetricKernels symmetricKernelsSetting() {
  static const SymmetricKernels setting = [] {
    const auto value = c10::utils::get_env("TORCH_NCCL_CORE_SYMMETRIC_KERNELS");
    if (!value || *value == "auto") {
      return SymmetricKernels::Auto;
    }
    if (*value == "always") {
      return SymmetricKernels::Always;
    }
    NCCL_CORE_CHECK_ARG(
        *value == "never",
        "TORCH_NCCL_CORE_SYMMETRIC_KERNELS",
        "must be auto, always or never, got '",
        *value,
        "'");
    return SymmetricKernels::Never;
  }();
  return setting;
}

bool symmetricKernelsWin(c10d::OpType type, size_t bytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  switch (type) {
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      // Below 2 MiB they gain nothing and lose up to 8% of an op's latency
      // (all-reduce at 128 KiB, reduce-scatter at 512 KiB); from 64 MiB the
      // ring wins.
      return bytes >= 2 * kMiB && bytes < 64 * kMiB;
    case c10d::OpType::_ALLGATHER_BASE:
      return false; // the registered ring is as fast or faster at every size
    case c10d::OpType::BROADCAST:
      return false; // window memory broadcast 3-12% slower at 2-32 MiB
    default:
      return true; // NCCL has no symmetric kernel to avoid
  }
}

bool registrationGains(c10d::OpType type) {
  return type != c10d::OpType::BROADCAST;
}

} // namespace nccl_core

// Communicator::suspend / resume / memoryStats: NCCL's ncclCommSuspend,
// ncclCommResume and ncclCommMemStats (NCCL >= 2.29.7),
// which c10d::Backend's suspend(), resume() and getMemoryStats() expose.
#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"

namespace nccl_core {

void Communicator::requireSuspendSupport(const NcclApi& api, const char* op) {
  NCCL_CORE_CHECK_SUPPORTED(
      api.commSuspend != nullptr && api.commResume != nullptr &&
          api.commMemStats != nullptr,
      op,
      "needs NCCL >= 2.29.7 (ncclCommSuspend, ncclCommResume, "
      "ncclCommMemStats); NCCL ",
      versionText(runtimeVersion().code),
      " is loaded");
}

Communicator& Communicator::refuseWhileSuspended() {
  NCCL_CORE_CHECK_STATE(
      !isSuspended(),
      label_,
      "is suspended: NCCL released its memory and takes no work until "
      "resume()");
  return *this;
}

void Communicator::suspend() {
  requireSuspendSupport(*api_, "suspend");
  std::lock_guard<std::mutex> lock(suspendMutex_);
  if (isSuspended()) {
    return;
  }
  DeviceGuard guard(*api_, device_);
  ncclResult_t result = ncclSuccess;
  {
    const HostCall inside(*this);
    result = api_->commSuspend(inside.handle(), kSuspendMemory);
  }
  // NCCL's refusal, before its barrier: a memory manager shared with another
  // communicator (split_share), or NCCL_MEM_MANAGER_DISABLE.
  NCCL_CORE_CHECK_STATE(
      result != ncclInvalidUsage || isAborted(),
      "suspend",
      label_,
      " cannot be suspended: NCCL refused (",
      lastError(),
      "); communicators that share resources (split_share) and "
      "NCCL_MEM_MANAGER_DISABLE=1 cannot");
  check(result, "ncclCommSuspend");
  suspended_.store(true, std::memory_order_release);
}

void Communicator::resume() {
  requireSuspendSupport(*api_, "resume");
  std::lock_guard<std::mutex> lock(suspendMutex_);
  if (!isSuspended()) {
    return;
  }
  DeviceGuard guard(*api_, device_);
  ncclResult_t result = ncclSuccess;
  {
    const HostCall inside(*this, /*whileSuspended=*/true);
    result = api_->commResume(inside.handle());
  }
  check(result, "ncclCommResume");
  suspended_.store(false, std::memory_order_release);
}

Communicator::MemoryStats Communicator::memoryStats() {
  requireSuspendSupport(*api_, "memory_stats");
  const auto read = [this](NcclMemStat stat) {
    uint64_t value = 0;
    ncclResult_t result = ncclSuccess;
    {
      const Use use(*this);
      result = api_->commMemStats(use.handle(), stat, &value);
    }
    check(result, "ncclCommMemStats");
    return value;
  };
  return MemoryStats{
      read(kMemStatSuspendable),
      read(kMemStatPersistent),
      read(kMemStatTotal),
      read(kMemStatSuspended) != 0};
}

} // namespace nccl_core

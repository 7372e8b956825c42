// NcclCoreBackend's registration of torch memory pools (torch.cuda.MemPool)
// and its registration statistics. A pool's segments are registered with the
// group's communicator at once, as torch's own NCCL backend does in
// registerMemPool; they are tracked in the allocation table, so torch's free
// of a segment (emptyCache, the pool's end) drops its registration first.
#include "backend/backend.h"
#include "nccl/caching_allocator_segments.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

std::string poolName(c10::MempoolId_t pool) {
  return c10::str("(", pool.first, ", ", pool.second, ")");
}

} // namespace

void NcclCoreBackend::registerMemPool(c10::MempoolId_t pool) {
  constexpr const char* kOp = "register_mem_pool";
  // Its later frees must drop what is registered now.
  NCCL_CORE_CHECK_SUPPORTED(
      trackCachingAllocatorSegments(),
      kOp,
      "needs torch's native CUDA caching allocator, whose segments can be "
      "tracked (PYTORCH_CUDA_ALLOC_CONF chose another)");
  Communicator& comm = communicator(deviceForOpWithoutTensors({}));
  std::lock_guard<std::mutex> lock(poolsMutex_);
  NCCL_CORE_CHECK_ARG(
      pools_.count(pool) == 0,
      kOp,
      "memory pool ",
      poolName(pool),
      " is registered with group '",
      *groupName_,
      "' already; deregister_mem_pool it first");
  const std::vector<Segment> segments = segmentsOfPool(pool);
  for (const Segment& segment : segments) {
    NCCL_CORE_CHECK_ARG(
        segment.device == comm.device(),
        kOp,
        "memory pool ",
        poolName(pool),
        " holds memory on cuda:",
        segment.device,
        ", but group '",
        *groupName_,
        "' runs on cuda:",
        comm.device());
  }
  pools_[pool] = routes_->registerSegments(segments);
}

void NcclCoreBackend::deregisterMemPool(c10::MempoolId_t pool) {
  std::vector<std::shared_ptr<RegisteredBuffer>> buffers;
  {
    std::lock_guard<std::mutex> lock(poolsMutex_);
    const auto registered = pools_.find(pool);
    NCCL_CORE_CHECK_ARG(
        registered != pools_.end(),
        "deregister_mem_pool",
        "memory pool ",
        poolName(pool),
        " is not registered with group '",
        *groupName_,
        "'");
    buffers = std::move(registered->second);
    pools_.erase(registered);
  }
  for (const auto& buffer : buffers) {
    buffer->close(); // a no-op where torch freed the segment already
  }
}

RegistrationStats NcclCoreBackend::registrationStats() {
  std::lock_guard<std::mutex> lock(timeoutMutex_); // routes_ is set under it
  return routes_ ? routes_->registrationStats() : RegistrationStats{};
}

} // namespace nccl_core

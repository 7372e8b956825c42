// Communication buffers from the backend (c10d's allocateTensor): NCCL memory
// cached by a torch MemPool, so repeated requests cost no ncclMemAlloc and
// the ops that use them run on registered memory.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "backend/backend.h"
#include "nccl/errors.h"
#include "nccl/memory.h"

namespace nccl_core {

namespace {

// Closes the routing of allocations to a pool on every exit path.
class AllocateToPool {
 public:
  AllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t pool)
      : device_(device), pool_(pool) {
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(
        device_, pool_, [](cudaStream_t) { return true; });
  }
  AllocateToPool(const AllocateToPool&) = delete;
  AllocateToPool& operator=(const AllocateToPool&) = delete;
  ~AllocateToPool() {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, pool_);
  }

 private:
  const c10::DeviceIndex device_;
  const c10::cuda::MempoolId_t pool_;
};

using PoolAllocator = c10::cuda::CUDACachingAllocator::CUDAAllocator;

const std::shared_ptr<PoolAllocator>& poolAllocator() {
  // One for the process: torch keeps allocators for its whole life.
  static const std::shared_ptr<PoolAllocator> allocator =
      torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
          nccl_core_pool_alloc, nccl_core_pool_free);
  return allocator;
}

} // namespace

std::shared_ptr<c10::Allocator> NcclCoreBackend::getMemAllocator() {
  return poolAllocator();
}

bool NcclCoreBackend::supportsTensorAlloc(c10::DeviceIndex /*deviceIdx*/) {
  // Any CUDA device (-1: the current one): ncclMemAlloc is in every NCCL
  // this package runs on.
  return true;
}

at::Tensor
NcclCoreBackend::allocateTensor(long size, at::TensorOptions options) {
  NCCL_CORE_CHECK_ARG(
      size >= 0, "allocateTensor", "size must be >= 0, got ", size);
  at::Device device =
      options.has_device() ? options.device() : deviceForOpWithoutTensors({});
  NCCL_CORE_CHECK_ARG(
      device.is_cuda(),
      "allocateTensor",
      "expected a CUDA device, got ",
      device);
  if (!device.has_index()) {
    device = at::Device(at::kCUDA, c10::cuda::current_device());
  }
  if (!memPool_) {
    c10::cuda::CUDAGuard guard(device.index());
    memPool_ = std::make_unique<at::cuda::MemPool>(poolAllocator());
  }
  NCCL_CORE_CHECK_ARG(
      memPool_->device() == device.index(),
      "allocateTensor",
      "this group allocates on cuda:",
      memPool_->device(),
      ", not on ",
      device);
  c10::cuda::CUDAGuard guard(device.index());
  AllocateToPool route(device.index(), memPool_->id());
  return at::empty({size}, options.device(device));
}

} // namespace nccl_core

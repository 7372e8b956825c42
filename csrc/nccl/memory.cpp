#include "nccl/memory.h"

#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <nccl.h>

#include <mutex>
#include <vector>

#include "nccl/allocations.h"
#include "nccl/api.h"
#include "nccl/dtypes.h"
#include "nccl/errors.h"
#include "nccl/stream_ordered_free.h"

namespace nccl_core {

namespace {

// `perTensor`: the allocation is one tensor's own (Allocation::perTensor).
void* allocate(size_t bytes, c10::DeviceIndex device, bool perTensor) {
  c10::cuda::CUDAGuard guard(device);
  freeFinished(/*wait=*/false);
  void* ptr = nullptr;
  if (realNccl().memAlloc(&ptr, bytes) != ncclSuccess) {
    // Memory freed but still in use on some stream may be what is missing.
    freeFinished(/*wait=*/true);
    NCCL_CORE_CHECK(realNccl(), realNccl().memAlloc(&ptr, bytes));
  }
  recordAllocation(
      ptr, bytes, device, MemoryKind::Nccl, /*current=*/true, perTensor);
  return ptr;
}

// A tensor's allocation: freed after the work on the stream it was allocated
// on and on the freeing thread's current stream (the caching allocator's
// contract; ops of async Work keep their tensors until they are done).
struct TensorAllocation {
  void* ptr;
  c10::DeviceIndex device;
  cudaStream_t stream;
};

void deleteAllocation(void* context) {
  auto* allocation = static_cast<TensorAllocation*>(context);
  const cudaStream_t streams[] = {
      allocation->stream,
      c10::cuda::getCurrentCUDAStream(allocation->device).stream()};
  // No lock of torch's is held in a tensor's deleter.
  freeAfter(
      allocation->ptr, allocation->device, streams, /*mayReleaseGil=*/true);
  delete allocation;
}

class NcclAllocator final : public c10::Allocator {
 public:
  explicit NcclAllocator(c10::DeviceIndex device) : device_(device) {}

  at::DataPtr allocate(size_t bytes) override {
    const at::Device device(at::kCUDA, device_);
    if (bytes == 0) {
      return {nullptr, nullptr, &c10::detail::deleteNothing, device};
    }
    void* ptr = nccl_core::allocate(bytes, device_, /*perTensor=*/true);
    const cudaStream_t stream =
        c10::cuda::getCurrentCUDAStream(device_).stream();
    return {
        ptr,
        new TensorAllocation{ptr, device_, stream},
        &deleteAllocation,
        device};
  }

  void
  copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

 private:
  const c10::DeviceIndex device_;
};

} // namespace

std::shared_ptr<c10::Allocator> ncclAllocator(c10::DeviceIndex device) {
  // One allocator per device, for the life of the process (torch keeps raw
  // pointers to allocators in storages).
  static std::mutex mutex;
  static std::vector<std::shared_ptr<c10::Allocator>> allocators;
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators.size() <= static_cast<size_t>(device)) {
    allocators.resize(device + 1);
  }
  if (!allocators[device]) {
    allocators[device] = std::make_shared<NcclAllocator>(device);
  }
  return allocators[device];
}

at::Tensor emptyTensor(
    at::IntArrayRef sizes,
    at::ScalarType dtype,
    c10::DeviceIndex device,
    bool columnMajor) {
  NCCL_CORE_CHECK_ARG_TYPE(
      ncclElementType(dtype).has_value(),
      "empty",
      "dtype ",
      dtype,
      " has no NCCL equivalent; expected one of ",
      kSupportedDtypes);
  for (int64_t size : sizes) {
    NCCL_CORE_CHECK_ARG(size >= 0, "empty", "sizes must be >= 0, got ", sizes);
  }
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Row-major: the last dim is contiguous; column-major: the first.
    const size_t dim = columnMajor ? i : sizes.size() - 1 - i;
    strides[dim] = stride;
    stride *= std::max<int64_t>(sizes[dim], 1);
  }
  return at::detail::empty_strided_generic(
      sizes,
      strides,
      ncclAllocator(device).get(),
      c10::DispatchKeySet(c10::DispatchKey::CUDA),
      dtype);
}

} // namespace nccl_core

void* nccl_core_pool_alloc(ssize_t size, int device, cudaStream_t /*stream*/) {
  // A segment the caching allocator carves tensors from, one after another.
  return nccl_core::allocate(
      static_cast<size_t>(size),
      static_cast<c10::DeviceIndex>(device),
      /*perTensor=*/false);
}

void nccl_core_pool_free(
    void* ptr,
    ssize_t /*size*/,
    int device,
    cudaStream_t stream) {
  // torch's caching allocator frees a segment (empty_cache, a pool's end)
  // once none of its blocks is in use but on `stream`, the segment's (it
  // waits for the other streams a block was recorded on first). This runs
  // under the allocator's lock, which a thread that took the GIL meanwhile
  // could be waiting for: nothing here lets go of the GIL.
  const cudaStream_t streams[] = {stream};
  nccl_core::freeAfter(ptr, device, streams, /*mayReleaseGil=*/false);
}

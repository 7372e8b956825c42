// Tensors on NCCL-allocated memory (ncclMemAlloc): the allocator behind
// torch_nccl_core.empty, mem_pool and the backend's allocateTensor.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <cuda_runtime_api.h>

#include <memory>

namespace nccl_core {

// A c10::Allocator handing out ncclMemAlloc memory on one device.
std::shared_ptr<c10::Allocator> ncclAllocator(c10::DeviceIndex device);

// An uninitialized tensor on NCCL memory, row-major or (columnMajor)
// column-major. Raises TypeError for dtypes NCCL lacks.
at::Tensor emptyTensor(
    at::IntArrayRef sizes,
    at::ScalarType dtype,
    c10::DeviceIndex device,
    bool columnMajor);

} // namespace nccl_core

// Entry points of torch.cuda.memory.CUDAPluggableAllocator, for mem_pool().
extern "C" {
void* nccl_core_pool_alloc(ssize_t size, int device, cudaStream_t stream);
void nccl_core_pool_free(
    void* ptr,
    ssize_t size,
    int device,
    cudaStream_t stream);
}

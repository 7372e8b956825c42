// A kernel that communicates by itself through an nccl_core device
// communicator: each rank copies the next LSA peer's half of a window into its
// own second half, between two LSA barriers. Built against the same NCCL
// headers as torch_nccl_core (the device API's structures are per release).
#include <c10/cuda/CUDAException.h>
#include <nccl_device.h>
#include <torch/extension.h>

namespace {

__global__ void
exchangeKernel(ncclDevComm devComm, ncclWindow_t window, size_t count) {
  ncclLsaBarrierSession<ncclCoopCta> barrier(
      ncclCoopCta(), devComm, ncclTeamTagLsa(), blockIdx.x);
  // Every rank has written its first half before anyone reads.
  barrier.sync(ncclCoopCta(), cuda::memory_order_acquire);
  const int peer = (devComm.lsaRank + 1) % devComm.lsaSize;
  const auto* src =
      static_cast<const float*>(ncclGetLsaPointer(window, 0, peer));
  auto* dst = static_cast<float*>(
      ncclGetLsaPointer(window, count * sizeof(float), devComm.lsaRank));
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) {
    dst[i] = src[i];
  }
  // No rank rewrites its first half while a peer may still read it.
  barrier.sync(ncclCoopCta(), cuda::memory_order_release);
}

// dev_comm: DevComm.ptr; window: Window.handle; count: floats per half.
void exchange(int64_t devComm, int64_t window, int64_t count, int64_t stream) {
  exchangeKernel<<<1, 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      *reinterpret_cast<const ncclDevComm*>(devComm),
      reinterpret_cast<ncclWindow_t>(window),
      static_cast<size_t>(count));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("exchange", &exchange, "LSA exchange through a device communicator");
}

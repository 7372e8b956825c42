// The device-API half of window_pointers: team queries, and on NCCL 2.28
// builds a kernel that reads window addresses the 2.28 host API cannot give.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl_device.h>

#include "nccl/errors.h"
#include "nccl/version.h"
#include "nccl/window_pointers.h"

namespace nccl_core::detail {

LsaTeam queryLsaTeam(ncclComm_t comm) {
  const ncclTeam_t team = ncclTeamLsa(comm);
  return {team.nRanks, team.rank, team.stride};
}

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0)

namespace {
__global__ void
readLsaBasesKernel(ncclWindow_t window, int lsaSize, uintptr_t* out) {
  for (int i = 0; i < lsaSize; ++i) {
    out[i] = reinterpret_cast<uintptr_t>(ncclGetLsaPointer(window, 0, i));
  }
}
} // namespace

bool canReadLsaBasesOnDevice() {
  // The kernel reads the window with this build's header layout.
  const NcclVersion& runtime = runtimeVersion();
  return runtime.major == NCCL_MAJOR && runtime.minor == NCCL_MINOR;
}

std::vector<uintptr_t>
readLsaBases(ncclWindow_t window, int lsaSize, int device) {
  // Host allocations and synchronisation cannot be captured.
  NCCL_CORE_CHECK_STATE(
      c10::cuda::currentStreamCaptureStatusMayInitCtx() ==
          c10::cuda::CaptureStatus::None,
      "window addresses",
      "they cannot be read while a CUDA graph is being captured (NCCL 2.28 "
      "reads them with a kernel); use the window once before capturing");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // A side stream, so a capture on the caller's stream is not disturbed; the
  // kernel writes straight into mapped host memory.
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(
      false, static_cast<c10::DeviceIndex>(device));
  uintptr_t* out = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(
      reinterpret_cast<void**>(&out),
      sizeof(uintptr_t) * lsaSize,
      cudaHostAllocMapped));
  readLsaBasesKernel<<<1, 1, 0, stream.stream()>>>(window, lsaSize, out);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t done = cudaStreamSynchronize(stream.stream());
  std::vector<uintptr_t> bases(out, out + lsaSize);
  C10_CUDA_CHECK_WARN(cudaFreeHost(out));
  C10_CUDA_CHECK(launched);
  C10_CUDA_CHECK(done);
  return bases;
}

#else

// Built against NCCL >= 2.29: the host API answers (window_pointers.cpp).
bool canReadLsaBasesOnDevice() {
  return false;
}

std::vector<uintptr_t> readLsaBases(ncclWindow_t, int, int) {
  NCCL_CORE_CHECK_SUPPORTED(
      false, "window addresses", "no device-side reader in this build");
}

#endif

} // namespace nccl_core::detail

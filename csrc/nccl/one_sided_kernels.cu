// The LoadStore engine's signal kernels: one thread each, so they cost an SM
// slot for microseconds, not a collective's worth of blocks.
#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "nccl/one_sided.h"

namespace nccl_core::detail {

namespace {

constexpr int kMaxDescs = 32; // per launch; longer lists take more launches

struct WaitArgs {
  int n;
  int peer[kMaxDescs];
  int count[kMaxDescs];
};

__global__ void signalKernel(unsigned long long* counter) {
  // Everything this stream wrote before (the put's copy included) is visible
  // system-wide before the peer can see the count move.
  __threadfence_system();
  atomicAdd_system(counter, 1ULL);
}

// Spins between looks at the abort flag, which lives in host memory (slow to
// read) while the counter is in device memory.
constexpr unsigned kSpinsPerAbortCheck = 256;

__global__ void waitKernel(
    const unsigned long long* inbox,
    unsigned long long* consumed,
    const volatile int* abortFlag,
    WaitArgs args) {
  for (int i = 0; i < args.n; ++i) {
    const int peer = args.peer[i];
    const unsigned long long target = consumed[peer] + args.count[i];
    const volatile unsigned long long* counter = inbox + peer;
    for (unsigned spins = 0; *counter < target; ++spins) {
      if (spins % kSpinsPerAbortCheck == 0 && *abortFlag != 0) {
        return; // the communicator was aborted: the signals will not come
      }
    }
    consumed[peer] = target;
  }
  // Reads of the window after this kernel see what the signals announced.
  __threadfence_system();
}

} // namespace

void launchSignal(uint64_t* counter, cudaStream_t stream) {
  signalKernel<<<1, 1, 0, stream>>>(
      reinterpret_cast<unsigned long long*>(counter));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launchWait(
    const uint64_t* inbox,
    uint64_t* consumed,
    const int* abortFlag,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream) {
  for (size_t first = 0; first < descs.size(); first += kMaxDescs) {
    WaitArgs args{};
    args.n =
        static_cast<int>(std::min<size_t>(kMaxDescs, descs.size() - first));
    for (int i = 0; i < args.n; ++i) {
      args.peer[i] = descs[first + i].peer;
      args.count[i] = descs[first + i].opCount;
    }
    waitKernel<<<1, 1, 0, stream>>>(
        reinterpret_cast<const unsigned long long*>(inbox),
        reinterpret_cast<unsigned long long*>(consumed),
        abortFlag,
        args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

} // namespace nccl_core::detail

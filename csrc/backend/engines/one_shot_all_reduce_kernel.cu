#include "backend/engines/one_shot_all_reduce_kernel.h"

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda/atomic>

#include <type_traits>

namespace nccl_core {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;
using Layout = OneShotLayout;
using Flag = cuda::atomic_ref<uint32_t, cuda::thread_scope_system>;

// Spins between looks at the abort flag, which lives in host memory.
constexpr unsigned kSpinsPerAbortCheck = 256;

__device__ uint32_t* inbox(char* staging, int block, int sender) {
  return reinterpret_cast<uint32_t*>(staging) + block * Layout::kMaxRanks +
         sender;
}

__device__ uint32_t* epochOf(char* staging, int block) {
  return reinterpret_cast<uint32_t*>(staging + Layout::kInboxBytes) + block;
}

// Block b of every rank meets block b of the others (ncclLsaBarrierSession's
// arrive and wait): thread p tells rank p that this block reached `epoch`,
// then waits until rank p says the same. The release makes what the block
// wrote before visible to the peers' blocks after theirs; the acquire the
// reverse. False when the communicator was aborted.
__device__ bool meet(const OneShotArgs& a, uint32_t epoch) {
  __shared__ int aborted;
  if (threadIdx.x == 0) {
    aborted = 0;
  }
  __syncthreads();
  const int peer = static_cast<int>(threadIdx.x);
  if (peer < a.size && peer != a.rank) {
    Flag(*inbox(a.staging[peer], blockIdx.x, a.rank))
        .store(epoch, cuda::memory_order_release);
    Flag mine(*inbox(a.staging[a.rank], blockIdx.x, peer));
    // Rolling compare: epochs wrap after 2**32 meetings.
    for (unsigned spins = 0;
         static_cast<int32_t>(mine.load(cuda::memory_order_acquire) - epoch) <
         0;
         ++spins) {
      if (spins % kSpinsPerAbortCheck == 0 && *a.abortFlag != 0) {
        aborted = 1;
        break;
      }
    }
  }
  __syncthreads();
  return aborted == 0;
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename Acc, RedOpType kOp>
__device__ Acc combine(Acc a, Acc b) {
  if constexpr (kOp == RedOpType::PRODUCT) {
    return a * b;
  } else if constexpr (kOp == RedOpType::MIN) {
    return (b != b || b < a) ? b : a; // a NaN wins, as in ATen's minimum
  } else if constexpr (kOp == RedOpType::MAX) {
    return (b != b || b > a) ? b : a;
  } else { // SUM, AVG
    return a + b;
  }
}

// Elements [first, first + N) of every rank's staging, reduced in rank
// order into `out`.
template <typename T, RedOpType kOp, int N>
__device__ void reducePack(const OneShotArgs& a, int64_t first, T* out) {
  using Acc = at::opmath_type<T>;
  Acc acc[N];
  for (int r = 0; r < a.size; ++r) {
    const auto* from = reinterpret_cast<const Pack<T, N>*>(
                           a.staging[r] + Layout::kDataOffset) +
                       first / N;
    const Pack<T, N> pack = *from;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const Acc v = static_cast<Acc>(pack.v[i]);
      acc[i] = r == 0 ? v : combine<Acc, kOp>(acc[i], v);
    }
  }
  Pack<T, N> result;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (kOp == RedOpType::AVG) {
      acc[i] /= static_cast<Acc>(a.size);
    }
    result.v[i] = static_cast<T>(acc[i]);
  }
  *reinterpret_cast<Pack<T, N>*>(out + first) = result;
}

template <typename T, RedOpType kOp, int N>
__global__ void __launch_bounds__(Layout::kThreads)
    oneShotAllReduceKernel(OneShotArgs a) {
  const int64_t begin = blockIdx.x * a.perBlock;
  const int64_t end =
      a.count < begin + a.perBlock ? a.count : begin + a.perBlock;
  const int64_t whole = begin + (end - begin) / N * N; // the tail: one by one
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  T* data = static_cast<T*>(a.data);
  T* mine = reinterpret_cast<T*>(a.staging[a.rank] + Layout::kDataOffset);
  const uint32_t epoch = *epochOf(a.staging[a.rank], blockIdx.x);

  // The block copies in exactly the elements the peers' block b reads.
  for (int64_t i = begin + threadIdx.x * N; i < whole; i += step) {
    *reinterpret_cast<Pack<T, N>*>(mine + i) =
        *reinterpret_cast<const Pack<T, N>*>(data + i);
  }
  for (int64_t i = whole + threadIdx.x; i < end; i += blockDim.x) {
    mine[i] = data[i];
  }
  if (!meet(a, epoch + 1)) {
    return;
  }
  for (int64_t i = begin + threadIdx.x * N; i < whole; i += step) {
    reducePack<T, kOp, N>(a, i, data);
  }
  for (int64_t i = whole + threadIdx.x; i < end; i += blockDim.x) {
    reducePack<T, kOp, 1>(a, i, data);
  }
  // No rank's next copy-in may overwrite its staging while a peer still
  // reads it: the next launch starts after every block met here.
  if (!meet(a, epoch + 2)) {
    return;
  }
  if (threadIdx.x == 0) {
    *epochOf(a.staging[a.rank], blockIdx.x) = epoch + 2;
  }
}

template <typename T, RedOpType kOp>
void launchFor(
    const OneShotArgs& args,
    int blocks,
    bool vector,
    cudaStream_t stream) {
  constexpr int kPack = 16 / sizeof(T);
  if (vector) {
    oneShotAllReduceKernel<T, kOp, kPack>
        <<<blocks, Layout::kThreads, 0, stream>>>(args);
  } else {
    oneShotAllReduceKernel<T, kOp, 1>
        <<<blocks, Layout::kThreads, 0, stream>>>(args);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launchForOp(
    const OneShotArgs& args,
    RedOpType op,
    int blocks,
    bool vector,
    cudaStream_t stream) {
  switch (op) {
    case RedOpType::SUM:
      return launchFor<T, RedOpType::SUM>(args, blocks, vector, stream);
    case RedOpType::PRODUCT:
      return launchFor<T, RedOpType::PRODUCT>(args, blocks, vector, stream);
    case RedOpType::MIN:
      return launchFor<T, RedOpType::MIN>(args, blocks, vector, stream);
    case RedOpType::MAX:
      return launchFor<T, RedOpType::MAX>(args, blocks, vector, stream);
    case RedOpType::AVG:
      if constexpr (std::is_floating_point_v<at::opmath_type<T>>) {
        return launchFor<T, RedOpType::AVG>(args, blocks, vector, stream);
      }
      break;
    default:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "one-shot all-reduce: unsupported op");
}

bool floating(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
         dtype == at::kBFloat16;
}

} // namespace

bool oneShotReduces(at::ScalarType dtype, RedOpType op) {
  const bool integral = dtype == at::kByte || dtype == at::kChar ||
                        dtype == at::kInt || dtype == at::kLong;
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::PRODUCT:
    case RedOpType::MIN:
    case RedOpType::MAX:
      return floating(dtype) || integral;
    case RedOpType::AVG:
      return floating(dtype);
    default:
      return false;
  }
}

void launchOneShotAllReduce(
    const OneShotArgs& args,
    at::ScalarType dtype,
    RedOpType op,
    int blocks,
    bool vector,
    cudaStream_t stream) {
  switch (dtype) {
    case at::kFloat:
      return launchForOp<float>(args, op, blocks, vector, stream);
    case at::kDouble:
      return launchForOp<double>(args, op, blocks, vector, stream);
    case at::kHalf:
      return launchForOp<c10::Half>(args, op, blocks, vector, stream);
    case at::kBFloat16:
      return launchForOp<c10::BFloat16>(args, op, blocks, vector, stream);
    case at::kByte:
      return launchForOp<uint8_t>(args, op, blocks, vector, stream);
    case at::kChar:
      return launchForOp<int8_t>(args, op, blocks, vector, stream);
    case at::kInt:
      return launchForOp<int32_t>(args, op, blocks, vector, stream);
    case at::kLong:
      return launchForOp<int64_t>(args, op, blocks, vector, stream);
    default:
      TORCH_INTERNAL_ASSERT(false, "one-shot all-reduce: unsupported dtype");
  }
}

} // namespace nccl_core

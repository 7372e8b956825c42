#include "backend/engines/load_store_kernels.h"

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda/atomic>

#include <type_traits>

namespace nccl_core {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;
using Layout = LoadStoreLayout;
using Flag = cuda::atomic_ref<uint32_t, cuda::thread_scope_system>;

// Spins between looks at the abort flag, which lives in host memory.
constexpr unsigned kSpinsPerAbortCheck = 256;

__device__ uint32_t* inbox(char* staging, int block, int sender) {
  return reinterpret_cast<uint32_t*>(staging) + block * Layout::kMaxRanks +
         sender;
}

// Block b of every rank meets block b of the others (ncclLsaBarrierSession's
// arrive and wait): thread p tells rank p that this block reached `epoch`,
// then waits until rank p says the same. The release makes what the block
// wrote before visible to the peers' blocks after theirs; the acquire the
// reverse. False when the communicator was aborted.
__device__ bool meet(const LoadStoreArgs& a, uint32_t epoch) {
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
    // Rolling compare: epochs wrap after 2**32 meetings. The first look at
    // the abort flag (a read over PCIe) comes after kSpinsPerAbortCheck
    // spins, not before the second look at the peer's flag.
    for (unsigned spins = 1;
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

template <typename T, int N>
__device__ Pack<T, N>* packAt(char* staging, int64_t first) {
  return reinterpret_cast<Pack<T, N>*>(staging + Layout::kDataOffset) +
         first / N;
}

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
// order. Every rank's load is issued before the first is used, so the
// peers' link latencies overlap.
template <typename T, RedOpType kOp, int N>
__device__ Pack<T, N> reduced(const LoadStoreArgs& a, int64_t first) {
  using Acc = at::opmath_type<T>;
  Pack<T, N> packs[Layout::kMaxRanks];
#pragma unroll
  for (int r = 0; r < Layout::kMaxRanks; ++r) {
    if (r < a.size) {
      packs[r] = *packAt<T, N>(a.staging[r], first);
    }
  }
  Acc acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    acc[i] = static_cast<Acc>(packs[0].v[i]);
  }
#pragma unroll
  for (int r = 1; r < Layout::kMaxRanks; ++r) {
    if (r < a.size) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        acc[i] = combine<Acc, kOp>(acc[i], static_cast<Acc>(packs[r].v[i]));
      }
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
  return result;
}

// Calls visit(i, n) for the elements [begin, end) of a block: packs of N
// from `begin` (a multiple of N), then the tail one by one.
template <int N, typename Visit>
__device__ void forEachPack(int64_t begin, int64_t end, Visit visit) {
  const int64_t whole = begin + (end - begin) / N * N;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t i = begin + threadIdx.x * N; i < whole; i += step) {
    visit(i, std::integral_constant<int, N>{});
  }
  for (int64_t i = whole + threadIdx.x; i < end; i += blockDim.x) {
    visit(i, std::integral_constant<int, 1>{});
  }
}

// The block's elements of each rank's part: [begin, end).
struct BlockRange {
  int64_t begin;
  int64_t end;
  __device__ explicit BlockRange(const LoadStoreArgs& a)
      : begin(blockIdx.x * a.perBlock),
        end(a.count < begin + a.perBlock ? a.count : begin + a.perBlock) {}
};

// The epoch block b's meetings start from, or false once the group was torn
// down (a graph replayed after it): then the block touches no staging.
// Every thread looks, so that a close between two looks still leaves the
// whole block gone or the whole block here.
__device__ bool enter(const LoadStoreArgs& a, uint32_t& epoch) {
  epoch = a.state->epoch[blockIdx.x];
  return !__syncthreads_or(
      *static_cast<const volatile uint32_t*>(&a.state->closed) != 0);
}

// After the last meeting, which no rank passes before every rank's block
// arrived: the next launch may overwrite the staging.
__device__ void leave(const LoadStoreArgs& a, uint32_t epoch) {
  if (threadIdx.x == 0) {
    a.state->epoch[blockIdx.x] = epoch + 2;
  }
}

// Copies elements [begin, end) of `from` into this rank's staging at
// `offset` + the same index (the elements the peers' same block reads).
template <typename T, int N>
__device__ void copyIn(
    const LoadStoreArgs& a,
    const T* from,
    int64_t offset,
    BlockRange range) {
  char* mine = a.staging[a.rank];
  forEachPack<N>(range.begin, range.end, [&](int64_t i, auto n) {
    constexpr int kN = decltype(n)::value;
    *packAt<T, kN>(mine, offset + i) =
        *reinterpret_cast<const Pack<T, kN>*>(from + offset + i);
  });
}

// enter(), then `copy` (this rank's elements into its staging), then the
// first meeting: true once every rank's elements are staged; false when the
// group was torn down or its communicator aborted.
template <typename Copy>
__device__ bool stageIn(const LoadStoreArgs& a, uint32_t& epoch, Copy copy) {
  if (!enter(a, epoch)) {
    return false;
  }
  copy();
  return meet(a, epoch + 1);
}

template <typename T, RedOpType kOp, int N, bool kTwoShot>
__global__ void __launch_bounds__(Layout::kThreads)
    allReduceKernel(LoadStoreArgs a) {
  const BlockRange range(a);
  T* data = static_cast<T*>(a.output);
  uint32_t epoch = 0;
  if (!stageIn(a, epoch, [&] { copyIn<T, N>(a, data, 0, range); })) {
    return;
  }
  if constexpr (kTwoShot) {
    // This rank's slice of the chunk, reduced into every rank's staging.
    const int64_t first = range.end < range.begin + a.rank * a.perRank
                              ? range.end
                              : range.begin + a.rank * a.perRank;
    const int64_t last =
        range.end < first + a.perRank ? range.end : first + a.perRank;
    forEachPack<N>(first, last, [&](int64_t i, auto n) {
      constexpr int kN = decltype(n)::value;
      const Pack<T, kN> result = reduced<T, kOp, kN>(a, i);
#pragma unroll
      for (int r = 0; r < Layout::kMaxRanks; ++r) {
        if (r < a.size) {
          *packAt<T, kN>(a.staging[r], i) = result;
        }
      }
    });
  } else {
    forEachPack<N>(range.begin, range.end, [&](int64_t i, auto n) {
      constexpr int kN = decltype(n)::value;
      *reinterpret_cast<Pack<T, kN>*>(data + i) = reduced<T, kOp, kN>(a, i);
    });
  }
  // One-shot: no rank's next copy-in may overwrite its staging while a peer
  // still reads it. Two-shot: every slice has arrived. Either way the next
  // launch starts after every block met here.
  if (!meet(a, epoch + 2)) {
    return;
  }
  if constexpr (kTwoShot) {
    forEachPack<N>(range.begin, range.end, [&](int64_t i, auto n) {
      constexpr int kN = decltype(n)::value;
      *reinterpret_cast<Pack<T, kN>*>(data + i) =
          *packAt<T, kN>(a.staging[a.rank], i);
    });
  }
  leave(a, epoch);
}

template <typename T, int N>
__global__ void __launch_bounds__(Layout::kThreads)
    allGatherKernel(LoadStoreArgs a) {
  const BlockRange range(a);
  T* out = static_cast<T*>(a.output);
  uint32_t epoch = 0;
  const T* in = static_cast<const T*>(a.input);
  if (!stageIn(a, epoch, [&] { copyIn<T, N>(a, in, 0, range); })) {
    return;
  }
  // Every rank's loads issued before the first store, as in reduced().
  forEachPack<N>(range.begin, range.end, [&](int64_t i, auto n) {
    constexpr int kN = decltype(n)::value;
    Pack<T, kN> packs[Layout::kMaxRanks];
#pragma unroll
    for (int r = 0; r < Layout::kMaxRanks; ++r) {
      if (r < a.size) {
        packs[r] = *packAt<T, kN>(a.staging[r], i);
      }
    }
#pragma unroll
    for (int r = 0; r < Layout::kMaxRanks; ++r) {
      if (r < a.size) {
        *reinterpret_cast<Pack<T, kN>*>(out + r * a.count + i) = packs[r];
      }
    }
  });
  if (!meet(a, epoch + 2)) { // no peer reads this staging any more
    return;
  }
  leave(a, epoch);
}

template <typename T, RedOpType kOp, int N>
__global__ void __launch_bounds__(Layout::kThreads)
    reduceScatterKernel(LoadStoreArgs a) {
  const BlockRange range(a);
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  uint32_t epoch = 0;
  const bool staged = stageIn(a, epoch, [&] {
    for (int r = 0; r < a.size; ++r) {
      copyIn<T, N>(a, in, r * a.count, range);
    }
  });
  if (!staged) {
    return;
  }
  const int64_t mine = a.rank * a.count;
  forEachPack<N>(range.begin, range.end, [&](int64_t i, auto n) {
    constexpr int kN = decltype(n)::value;
    *reinterpret_cast<Pack<T, kN>*>(out + i) = reduced<T, kOp, kN>(a, mine + i);
  });
  if (!meet(a, epoch + 2)) {
    return;
  }
  leave(a, epoch);
}

// What one launch takes besides its dtype and op.
struct Launch {
  LoadStoreKernel kernel;
  const LoadStoreArgs& args;
  int blocks;
  bool vector;
  cudaStream_t stream;
};

template <typename T, RedOpType kOp, int N>
void launchPacked(const Launch& l) {
  const auto run = [&](auto entry) {
    entry<<<l.blocks, Layout::kThreads, 0, l.stream>>>(l.args);
  };
  switch (l.kernel) {
    case LoadStoreKernel::OneShot:
      return run(allReduceKernel<T, kOp, N, false>);
    case LoadStoreKernel::TwoShot:
      return run(allReduceKernel<T, kOp, N, true>);
    case LoadStoreKernel::ReduceScatter:
      return run(reduceScatterKernel<T, kOp, N>);
    case LoadStoreKernel::AllGather:
      if constexpr (std::is_same_v<T, uint8_t> && kOp == RedOpType::SUM) {
        return run(allGatherKernel<T, N>);
      }
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "load/store kernels: unsupported launch");
}

template <typename T, RedOpType kOp>
void launchFor(const Launch& l) {
  constexpr int kPack = 16 / sizeof(T);
  l.vector ? launchPacked<T, kOp, kPack>(l) : launchPacked<T, kOp, 1>(l);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launchForOp(const Launch& l, RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
      return launchFor<T, RedOpType::SUM>(l);
    case RedOpType::PRODUCT:
      return launchFor<T, RedOpType::PRODUCT>(l);
    case RedOpType::MIN:
      return launchFor<T, RedOpType::MIN>(l);
    case RedOpType::MAX:
      return launchFor<T, RedOpType::MAX>(l);
    case RedOpType::AVG:
      if constexpr (std::is_floating_point_v<at::opmath_type<T>>) {
        return launchFor<T, RedOpType::AVG>(l);
      }
      break;
    default:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "load/store all-reduce: unsupported op");
}

bool floating(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
         dtype == at::kBFloat16;
}

} // namespace

bool loadStoreReduces(at::ScalarType dtype, RedOpType op) {
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

void launchLoadStore(
    LoadStoreKernel kernel,
    const LoadStoreArgs& args,
    at::ScalarType dtype,
    RedOpType op,
    int blocks,
    bool vector,
    cudaStream_t stream) {
  const Launch l{kernel, args, blocks, vector, stream};
  if (kernel == LoadStoreKernel::AllGather) {
    // It moves bytes, whatever they hold: one instance.
    dtype = at::kByte;
    op = RedOpType::SUM;
  }
  switch (dtype) {
    case at::kFloat:
      return launchForOp<float>(l, op);
    case at::kDouble:
      return launchForOp<double>(l, op);
    case at::kHalf:
      return launchForOp<c10::Half>(l, op);
    case at::kBFloat16:
      return launchForOp<c10::BFloat16>(l, op);
    case at::kByte:
      return launchForOp<uint8_t>(l, op);
    case at::kChar:
      return launchForOp<int8_t>(l, op);
    case at::kInt:
      return launchForOp<int32_t>(l, op);
    case at::kLong:
      return launchForOp<int64_t>(l, op);
    default:
      TORCH_INTERNAL_ASSERT(false, "load/store all-reduce: unsupported dtype");
  }
}

} // namespace nccl_core

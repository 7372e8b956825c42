// The one-shot all-reduce kernel (one_shot_all_reduce.h runs it): every rank
// copies its data into its staging, the ranks meet, and each reads every
// rank's staging through the load/store mappings and reduces it into its own
// data, in rank order, so every rank gets the same bits. The algorithm of
// PyTorch's symmetric-memory one_shot_all_reduce_copy; the per-block barrier
// is NCCL's ncclLsaBarrierSession (device API) written out here so that its
// wait returns when the communicator is aborted, on every NCCL release.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>

namespace nccl_core {

struct OneShotLayout {
  static constexpr int kMaxRanks = 8;
  static constexpr int kMaxBlocks = 16;
  static constexpr int kThreads = 512;
  // Staging per rank: the barrier inbox (one flag per block and sender),
  // this rank's epoch per block, then the data.
  static constexpr size_t kInboxBytes = kMaxBlocks * kMaxRanks * 4;
  static constexpr size_t kDataOffset = 1024;
};

struct OneShotArgs {
  void* data; // this rank's tensor, reduced in place
  // Every rank's staging, as mapped on this rank.
  char* staging[OneShotLayout::kMaxRanks];
  const volatile int* abortFlag; // set: the barrier waits return
  int rank;
  int size;
  int64_t count;
  int64_t perBlock; // elements per block, a multiple of the pack
};

// Whether the kernel reduces `dtype` with `op` as NCCL does, up to rounding:
// it sums in rank order (half and bfloat16 in float) and averages by dividing
// the sum, so at three or more ranks the last bit may differ from NCCL's;
// every rank gets the same bits.
bool oneShotReduces(at::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// Launches `blocks` blocks (at most kMaxBlocks, the same on every rank).
// `vector`: this rank's data allows 16-byte loads and stores.
void launchOneShotAllReduce(
    const OneShotArgs& args,
    at::ScalarType dtype,
    c10d::ReduceOp::RedOpType op,
    int blocks,
    bool vector,
    cudaStream_t stream);

} // namespace nccl_core

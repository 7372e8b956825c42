// The load/store all-reduce kernels (load_store_all_reduce.h runs them).
// Both copy this rank's data into its staging, meet the peers, and read the
// peers' staging through the load/store mappings:
// - one-shot: every rank reads every rank's staging and reduces all of it
//   into its own data (PyTorch symmetric memory's one_shot_all_reduce_copy);
//   least latency, but (ranks - 1) x the data read over the links;
// - two-shot: rank r reduces the r-th slice of every block's chunk, writes
//   the result into that slice of every rank's staging, and after a second
//   meeting every rank copies its staging out (reduce-scatter then
//   all-gather through the staging, as symmetric memory's
//   two_shot_all_reduce_ and vLLM's cross_device_reduce_2stage): 2 (ranks -
//   1) / ranks x the data over the links, so it wins from some size on.
// Ranks reduce in rank order (half and bfloat16 in float), so every rank
// gets the same bits. The per-block meeting is NCCL's ncclLsaBarrierSession
// (device API) written out here so that its wait returns when the
// communicator is aborted, on every NCCL release.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>

namespace nccl_core {

enum class AllReduceKernel { OneShot, TwoShot };

struct AllReduceLayout {
  static constexpr int kMaxRanks = 8;
  static constexpr int kMaxBlocks = 64;
  static constexpr int kThreads = 512;
  // Staging per rank: the meeting inbox (one flag per block and sender),
  // this rank's epoch per block, then the data.
  static constexpr size_t kInboxBytes = kMaxBlocks * kMaxRanks * 4;
  static constexpr size_t kDataOffset = 4096;
  static_assert(kInboxBytes + kMaxBlocks * 4 <= kDataOffset);
};

struct AllReduceArgs {
  void* data; // this rank's tensor, reduced in place
  // Every rank's staging, as mapped on this rank.
  char* staging[AllReduceLayout::kMaxRanks];
  const volatile int* abortFlag; // set: the meetings' waits return
  int rank;
  int size;
  int64_t count;
  int64_t perBlock; // elements per block, a multiple of the pack
  int64_t perRank;  // two-shot: elements of a block's chunk each rank reduces
};

// Whether the kernels reduce `dtype` with `op` as NCCL does, up to rounding:
// they sum in rank order (half and bfloat16 in float) and average by
// dividing the sum, so at three or more ranks the last bit may differ from
// NCCL's; every rank gets the same bits.
bool loadStoreReduces(at::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// Launches `kernel` in `blocks` blocks (at most kMaxBlocks, the same on
// every rank). `vector`: this rank's data allows 16-byte loads and stores.
void launchAllReduce(
    AllReduceKernel kernel,
    const AllReduceArgs& args,
    at::ScalarType dtype,
    c10d::ReduceOp::RedOpType op,
    int blocks,
    bool vector,
    cudaStream_t stream);

} // namespace nccl_core

// The load/store kernels (load_store_collectives.h runs them). Each copies
// this rank's data into its staging, meets the peers, and reads the peers'
// staging through the load/store mappings. All-reduce:
// - one-shot: every rank reads every rank's staging and reduces all of it
//   into its own data (PyTorch symmetric memory's one_shot_all_reduce_copy);
//   least latency, but (ranks - 1) x the data read over the links;
// - two-shot: rank r reduces the r-th slice of every block's chunk, writes
//   the result into that slice of every rank's staging, and after a second
//   meeting every rank copies its staging out (reduce-scatter then
//   all-gather through the staging, as symmetric memory's
//   two_shot_all_reduce_ and vLLM's cross_device_reduce_2stage): 2 (ranks -
//   1) / ranks x the data over the links, so it wins from some size on.
// All-gather: every rank copies every rank's staging into its part of the
// output. Reduce-scatter: every rank copies its whole input in and reduces
// its part of every rank's staging into its output (symmetric memory's
// one-shot all_gather and reduce_scatter, the first half of two-shot).
// Ranks reduce in rank order (half and bfloat16 in float), so every rank
// gets the same bits. The per-block meeting is NCCL's ncclLsaBarrierSession
// (device API) written out here so that its wait returns when the
// communicator is aborted, on every NCCL release.
// A group's LoadStoreState outlives its communicator while a CUDA graph
// holds it: a graph replayed after its group was torn down finds the state
// closed and returns before it touches the staging, gone with the group.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>

namespace nccl_core {

enum class LoadStoreKernel { OneShot, TwoShot, AllGather, ReduceScatter };

struct LoadStoreLayout {
  static constexpr int kMaxRanks = 8;
  static constexpr int kMaxBlocks = 64;
  static constexpr int kThreads = 512;
  // Staging per rank: the meeting inbox (one flag per block and sender),
  // then the data.
  static constexpr size_t kInboxBytes = kMaxBlocks * kMaxRanks * 4;
  static constexpr size_t kDataOffset = 4096;
  static_assert(kInboxBytes <= kDataOffset);
};

// What a group's kernels keep on this rank between launches.
struct LoadStoreState {
  uint32_t closed; // set once the group is torn down
  uint32_t epoch[LoadStoreLayout::kMaxBlocks]; // meetings each block held
};

struct LoadStoreArgs {
  // This rank's tensors: one for an all-reduce (in place); for an all-gather
  // `count` elements in and `size` x `count` out, for a reduce-scatter the
  // reverse.
  const void* input;
  void* output;
  // Every rank's staging, as mapped on this rank.
  char* staging[LoadStoreLayout::kMaxRanks];
  const volatile int* abortFlag; // set: the meetings' waits return
  LoadStoreState* state;         // this group's, on this rank
  int rank;
  int size;
  int64_t count;    // elements of the all-reduce, or of each rank's part
  int64_t perBlock; // elements per block, a multiple of the pack
  int64_t perRank;  // two-shot: elements of a block's chunk each rank reduces
};

// Whether the kernels reduce `dtype` with `op` as NCCL does, up to rounding:
// they sum in rank order (half and bfloat16 in float) and average by
// dividing the sum, so at three or more ranks the last bit may differ from
// NCCL's; every rank gets the same bits.
bool loadStoreReduces(at::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// Launches `kernel` in `blocks` blocks (at most kMaxBlocks, the same on
// every rank), reducing with `op`. An all-gather moves bytes, whatever
// `dtype` and `op` say (its count is then in bytes). `vector`: this rank's
// tensors and parts allow 16-byte loads and stores.
void launchLoadStore(
    LoadStoreKernel kernel,
    const LoadStoreArgs& args,
    at::ScalarType dtype,
    c10d::ReduceOp::RedOpType op,
    int blocks,
    bool vector,
    cudaStream_t stream);

} // namespace nccl_core

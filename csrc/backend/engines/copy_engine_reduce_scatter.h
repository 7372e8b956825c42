// Reduce-scatter through the copy engine, for groups whose ranks all map each
// other's memory (one NVLink domain). On 2 H200s NCCL's reduce-scatter moves
// 1 GiB at ~275 GB/s bus bandwidth, while copy-engine writes to a peer reach
// ~388 GB/s (docs/performance.md). Here each rank writes, chunk by chunk, the
// parts its peers own into their staging memory, and each rank reduces a
// chunk with ATen kernels while the next one is in flight. Signals (one-
// thread kernels on the communicator's signal window) say a chunk arrived and
// a staging slot is free again.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "backend/engines/engine.h"
#include "backend/engines/staging.h"

namespace nccl_core {

class CopyEngineReduceScatter final : public Engine {
 public:
  CopyEngineReduceScatter(Communicator& comm, EventPool& events);

  // A reduce-scatter (tensor form), where every peer is load/store
  // reachable, of an op and dtype ATen reduces as NCCL does, not captured in
  // a CUDA graph.
  bool suits(const EngineCall& call) override;
  // Enqueues output = reduction over ranks of their input part for this rank.
  void enqueue(const EngineCall& call, cudaStream_t stream) override;
  // Lets the staging streams finish.
  void drain() const noexcept override;
  // Whether the staging was made (the peers map it through the
  // communicator's window).
  bool hasStaging() const override;

 private:
  // Staging per sender: kSlots chunks of at most kChunkBytes.
  static constexpr size_t kChunkBytes = size_t{32} << 20;
  static constexpr int kSlots = 3;
  static constexpr size_t kRegionBytes = kSlots * kChunkBytes;

  struct Pass;
  struct Chunk;

  // The staging, made with the first enqueue (collective then).
  const Staging& staging(size_t bytes);
  // `waiter` goes on once `stream`'s work so far is done. One event serves
  // every pair: a wait takes the event as last recorded.
  void after(cudaStream_t waiter, cudaStream_t stream);
  // The pipeline's two steps for each chunk: copy it into the peers'
  // staging and signal them; wait for the peers' copies and reduce them.
  void send(const Pass& pass, const Chunk& part);
  void reduce(const Pass& pass, const Chunk& part);

  Communicator& comm_;
  // Guards staging_, which drain() reads from the aborting thread.
  mutable std::mutex stagingMutex_;
  std::unique_ptr<Staging> staging_;
  EventPool::Event order_; // orders the streams (see after())
  std::optional<bool> allPeersLoadStore_;
  // Host bookkeeping of the staging slots (why a captured op cannot take
  // this path): slots at each peer written and not yet freed.
  int slotsInUse_ = 0;
  int nextSlot_ = 0;
};

} // namespace nccl_core

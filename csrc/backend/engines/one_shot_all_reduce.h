// All-reduce of small messages in one kernel, for groups whose ranks all map
// each other's memory (one NVLink domain): latency rather than bandwidth, so
// one launch and two meetings of the ranks instead of NCCL's protocol. The
// data goes through this engine's staging (a window of the package's own),
// so it takes tensors in any memory, in place, and is capturable once the
// staging exists. Off unless Options.one_shot_all_reduce (or
// TORCH_NCCL_CORE_ONE_SHOT_ALL_REDUCE=1) turns it on: where it beats NCCL is
// to be measured on two or more GPUs (benchmarks: bench_one_shot).
// Limits: eager launches are ordered across streams and waited for by an
// abort, graph replays are not (replay them ordered with the group's eager
// ops); and a group's first such op makes the staging collectively, so it
// must run eagerly on every rank or captured on every rank alike.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>
#include <mutex>
#include <optional>

#include "backend/engines/engine.h"
#include "nccl/peer_buffer.h"

namespace nccl_core {

class OneShotAllReduce final : public Engine {
 public:
  OneShotAllReduce(Communicator& comm, EventPool& events);

  // An all-reduce (in place) of at most kMaxBytes, of a dtype and op the
  // kernel reduces as NCCL does, where every peer is load/store reachable,
  // and, under capture, with the staging made before (making it is
  // collective).
  bool suits(const EngineCall& call) override;
  // Enqueues the all-reduce on `stream`, after this engine's previous eager
  // one on any stream (the ranks' blocks meet in the staging, one op at a
  // time).
  void enqueue(const EngineCall& call, cudaStream_t stream) override;
  // Waits (up to a second) for the last eager launch, whose barrier waits
  // return once the communicator's abort flag is set.
  void drain() const noexcept override;
  // Whether the staging was made (the peers map it through its window).
  bool hasStaging() const override;

  static constexpr size_t kMaxBytes = size_t{256} << 10;

 private:
  // The staging, made with the first enqueue (collective then).
  const PeerBuffer& staging();

  Communicator& comm_;
  // Guards staging_, which drain() reads from the aborting thread.
  mutable std::mutex stagingMutex_;
  std::unique_ptr<PeerBuffer> staging_;
  const int* abortFlag_ = nullptr;    // the signal window's
  EventPool::Event done_;             // the last eager launch's end
  cudaStream_t lastStream_ = nullptr; // the stream it ran on
  std::optional<bool> allPeersLoadStore_;
};

} // namespace nccl_core

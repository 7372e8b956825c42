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

#include "backend/event_pool.h"
#include "nccl/communicator.h"
#include "nccl/peer_buffer.h"

namespace nccl_core {

// An all-reduce this engine may run in NCCL's place.
struct AllReduceCall {
  const at::Tensor& tensor; // reduced in place
  c10d::ReduceOp::RedOpType op;
};

class OneShotAllReduce {
 public:
  OneShotAllReduce(Communicator& comm, EventPool& events);
  OneShotAllReduce(const OneShotAllReduce&) = delete;
  OneShotAllReduce& operator=(const OneShotAllReduce&) = delete;

  // Whether `call` takes this path: at most kMaxBytes, a dtype and op the
  // kernel reduces as NCCL does, every peer load/store reachable, and, under
  // capture, the staging made before (making it is collective). The same
  // answer on every rank for the same call and history.
  bool suits(const AllReduceCall& call, bool capturing);

  // Enqueues the all-reduce on `stream`, after this engine's previous eager
  // one on any stream (the ranks' blocks meet in the staging, one op at a
  // time). `capturing`: as routing found it, so it is not asked again.
  void enqueue(const AllReduceCall& call, cudaStream_t stream, bool capturing);

  // Waits (up to a second) for the last eager launch, whose barrier waits
  // return once the communicator's abort flag is set.
  void drain() const noexcept;
  // Whether the staging was made: the communicator must then be aborted
  // before this is destroyed (the peers map it through its window).
  bool hasStaging() const;

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

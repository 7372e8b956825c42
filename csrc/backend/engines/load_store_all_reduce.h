// All-reduce in one kernel of the package's own (all_reduce_kernels.h: one-
// shot or two-shot), for groups whose ranks all map each other's memory (one
// NVLink domain): NCCL's protocol costs more than the work at the sizes a
// tensor-parallel layer reduces. The data goes through this engine's staging
// (a window of the package's own), so it takes tensors in any memory, in
// place, and is capturable once the staging exists.
// Which kernel runs, and up to which size, follows the measured crossovers
// with NCCL at the group's size, eagerly and under capture
// (docs/performance.md, "Tensor-parallel decode"): Options.all_reduce_kernels
// or TORCH_NCCL_CORE_ALL_REDUCE_KERNELS ("auto", "off", "one_shot",
// "two_shot": one kernel at every size the staging holds; "off" unless
// asked, see options.h).
// The staging is made with the communicator (collective, as its
// initialization is): no op ever waits on the host for its peers, and a
// group's first all-reduce may be captured. It costs every such group
// kDataOffset + the largest routed size of NCCL memory per rank.
// Limits: eager launches are ordered across streams and waited for by an
// abort, graph replays are not (replay them ordered with the group's eager
// ops).
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>
#include <mutex>
#include <optional>

#include "backend/engines/all_reduce_kernels.h"
#include "backend/engines/engine.h"
#include "nccl/peer_buffer.h"

namespace nccl_core {

// Which of the kernels all-reduces, and up to which size (bytes).
struct AllReduceKernelChoice {
  size_t oneShotMax = 0; // one-shot up to here
  size_t twoShotMax = 0; // two-shot above, up to here; NCCL beyond

  // The kernel for `bytes`, or none (NCCL).
  std::optional<AllReduceKernel> kernelFor(size_t bytes) const;
  size_t maxBytes() const;

  // For a group of `ranks`, eagerly or under capture, as `setting` (see
  // above) says; "auto" follows the measured table.
  static AllReduceKernelChoice
  of(AllReduceKernels setting, int ranks, bool capturing);
};

class LoadStoreAllReduce final : public Engine {
 public:
  // Collective over `comm`: makes the staging where every peer is load/store
  // reachable (elsewhere the engine suits nothing).
  LoadStoreAllReduce(
      Communicator& comm,
      EventPool& events,
      AllReduceKernels setting);

  // An all-reduce (in place) of a size the choice gives a kernel, of a dtype
  // and op the kernels reduce as NCCL does, where every peer is load/store
  // reachable.
  bool suits(const EngineCall& call) override;
  // Enqueues the all-reduce on `stream`, after this engine's previous eager
  // one on any stream (the ranks' blocks meet in the staging, one op at a
  // time).
  void enqueue(const EngineCall& call, cudaStream_t stream) override;
  // Waits (up to a second) for the last eager launch, whose meetings' waits
  // return once the communicator's abort flag is set.
  void drain() const noexcept override;
  // Whether the staging was made (the peers map it through its window).
  bool hasStaging() const override {
    return staging_ != nullptr;
  }

  // The data part of the staging: what the largest routed op needs.
  static constexpr size_t kMaxBytes = size_t{8} << 20;

 private:
  Communicator& comm_;
  const AllReduceKernelChoice eager_;
  const AllReduceKernelChoice captured_;
  const int* abortFlag_ = nullptr; // the signal window's
  // Set where every peer is load/store reachable.
  std::unique_ptr<PeerBuffer> staging_;
  // Orders enqueues from several threads (done_ and lastStream_).
  std::mutex enqueueMutex_;
  EventPool::Event done_;             // the last eager launch's end
  cudaStream_t lastStream_ = nullptr; // the stream it ran on
};

} // namespace nccl_core

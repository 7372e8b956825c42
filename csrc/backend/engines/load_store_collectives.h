// All-reduce, all-gather and reduce-scatter in one kernel of the package's
// own (load_store_kernels.h), for groups whose ranks all map each other's
// memory (one NVLink domain): NCCL's protocol costs more than the work at
// the sizes a tensor-parallel layer moves. The data goes through this
// engine's staging (a window of the package's own), so it takes tensors in
// any memory, and is capturable.
// Which kernel runs, and up to which size, follows the measured crossovers
// with NCCL at the group's size, eagerly and under capture
// (docs/performance.md, "Tensor-parallel decode"): Options.all_reduce_kernels
// or TORCH_NCCL_CORE_ALL_REDUCE_KERNELS ("auto", "off", "one_shot",
// "two_shot": one kernel at every size the staging holds), and
// Options.gather_scatter_kernels or TORCH_NCCL_CORE_GATHER_SCATTER_KERNELS
// (see options.h).
// The staging is made with the communicator (collective, as its
// initialization is): no op ever waits on the host for its peers, and a
// group's first all-reduce may be captured. It costs every such group
// kDataOffset + the largest routed size of NCCL memory per rank.
// A CUDA graph that captured the kernels may outlive the group: it keeps the
// group's LoadStoreState, which teardown closes, so a replay then returns
// without touching the peers (as NCCL's kernels end on its abort flag).
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

#include "backend/engines/engine.h"
#include "backend/engines/load_store_kernels.h"
#include "nccl/peer_buffer.h"

namespace nccl_core {

// Which kernel runs an op, up to which size: bytes of its larger tensor.
struct KernelChoice {
  size_t oneShotMax = 0;       // all-reduce: one-shot up to here
  size_t twoShotMax = 0;       // two-shot above, up to here; NCCL beyond
  size_t allGatherMax = 0;     // all-gather, its output
  size_t reduceScatterMax = 0; // reduce-scatter, its input

  // The kernel for an op of `type` whose larger tensor holds `bytes`, or
  // none (NCCL).
  std::optional<LoadStoreKernel>
  kernelFor(c10d::OpType type, size_t bytes) const;
  size_t maxBytes() const;

  // For a group of `ranks`, eagerly or under capture, as the settings (see
  // above) say; "auto" and unset follow the measured table.
  static KernelChoice
  of(const NcclCoreOptions& options, int ranks, bool capturing);
  // The measured table's alone, whatever the options and environment say.
  static KernelChoice measured(int ranks, bool capturing);
};

class LoadStoreCollectives final : public Engine {
 public:
  // Collective over `comm`: makes the staging where every peer is load/store
  // reachable (elsewhere the engine suits nothing).
  LoadStoreCollectives(
      Communicator& comm,
      EventPool& events,
      const NcclCoreOptions& options);
  ~LoadStoreCollectives() override;

  // An all-reduce (in place), all-gather or reduce-scatter (one tensor each
  // way) of a size the choice gives a kernel, of a dtype and op the kernels
  // reduce as NCCL does, where every peer is load/store reachable.
  bool suits(const EngineCall& call) override;
  // Enqueues the op on `stream`, after this engine's previous eager one on
  // any stream (the ranks' blocks meet in the staging, one op at a time).
  void enqueue(const EngineCall& call, cudaStream_t stream) override;
  // Closes the group's state for graphs replayed from now on, then waits (up
  // to a second) for the last eager launch, whose meetings' waits return once
  // the communicator's abort flag is set.
  void drain() const noexcept override;
  // Whether the staging was made (the peers map it through its window).
  bool hasStaging() const override {
    return staging_ != nullptr;
  }

  // The data part of the staging: what the largest routed op needs.
  static constexpr size_t kMaxBytes = size_t{8} << 20;

 private:
  void connectNccl();

  Communicator& comm_;
  const KernelChoice eager_;
  const KernelChoice captured_;
  const int* abortFlag_ = nullptr; // the signal window's
  // Set where every peer is load/store reachable.
  std::unique_ptr<PeerBuffer> staging_;
  struct StreamDestroyer {
    void operator()(cudaStream_t stream) const noexcept;
  };
  // Set-up and closing writes, never an op.
  std::unique_ptr<CUstream_st, StreamDestroyer> stream_;
  std::shared_ptr<LoadStoreState> state_; // shared with graphs
  // Orders enqueues from several threads (done_, lastStream_, lastCapture_).
  std::mutex enqueueMutex_;
  EventPool::Event done_;              // the last eager launch's end
  cudaStream_t lastStream_ = nullptr;  // the stream it ran on
  unsigned long long lastCapture_ = 0; // the last capture given the state
};

} // namespace nccl_core

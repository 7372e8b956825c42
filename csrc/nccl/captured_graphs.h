// The CUDA graphs alive that captured NCCL work of one communicator.
//
// NCCL's ncclCommAbort and ncclCommDestroy wait until every graph holding a
// persistent plan of the communicator is destroyed (commDestroySync polls
// localPersistentRefs), which a program may do long after, or never. Counting
// those graphs lets teardown hand the wait to a thread of its own.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>

namespace nccl_core {

class CapturedGraphs {
 public:
  // Counts the graph being captured on `stream`, once per capture; the count
  // drops when CUDA destroys the graph.
  void note(cudaStream_t stream);
  int live() const {
    return live_->load(std::memory_order_acquire);
  }

 private:
  // Shared with the graphs' user objects, which may outlive the communicator.
  const std::shared_ptr<std::atomic<int>> live_ =
      std::make_shared<std::atomic<int>>(0);
  std::atomic<unsigned long long> lastCapture_{0};
};

} // namespace nccl_core

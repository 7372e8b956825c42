// CUDA graphs that captured work of this package's, and what they must keep
// alive.
//
// NCCL's ncclCommAbort and ncclCommDestroy wait until every graph holding a
// persistent plan of the communicator is destroyed (commDestroySync polls
// localPersistentRefs), which a program may do long after, or never. Counting
// those graphs lets teardown hand the wait to a thread of its own.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <optional>

namespace nccl_core {

// The capture `stream` takes part in, if any: its id and graph.
struct Capture {
  unsigned long long id;
  cudaGraph_t graph;
};
std::optional<Capture> activeCapture(cudaStream_t stream);

// Keeps `owner` alive until CUDA destroys `graph` (a user object the graph
// holds). Its last release may then run on a CUDA thread: it must make no
// CUDA call.
void keepUntilDestroyed(cudaGraph_t graph, std::shared_ptr<void> owner);

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

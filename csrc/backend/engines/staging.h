// Staging memory every load/store peer maps, with the streams that work on
// it, for the copy engine's collectives (copy_engine_reduce_scatter.h).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>

#include "nccl/peer_buffer.h"

namespace nccl_core {

// `copies` writes peers' staging (copy engine only, so nothing else may delay
// the next copy), `gate` waits until a peer freed a slot, `signals` says a
// chunk arrived, `reductions` consumes this rank's staging. drain() lets them
// finish when the communicator is aborted, before NCCL unmaps the peers'
// memory they write to; the owner (CopyEngineReduceScatter) destroys it after
// that abort.
class Staging {
 public:
  // Collective over `comm`, like PeerBuffer.
  Staging(Communicator& comm, size_t bytes);
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging();

  const PeerBuffer& buffer() const {
    return buffer_;
  }
  cudaStream_t copies() const {
    return streams_[0];
  }
  cudaStream_t gate() const {
    return streams_[1];
  }
  cudaStream_t signals() const {
    return streams_[2];
  }
  cudaStream_t reductions() const {
    return streams_[3];
  }
  // Waits up to `limit` for the streams to run out of work. Their waits end
  // once the communicator's abort flag is set; what is still held back by
  // other streams past `limit` is left.
  void drain(std::chrono::milliseconds limit) const noexcept;

 private:
  PeerBuffer buffer_;
  int device_;
  std::array<cudaStream_t, 4> streams_{};
};

} // namespace nccl_core

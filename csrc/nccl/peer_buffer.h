// Device memory of this package's own (signal counters, staging), registered
// as a window on every rank of a communicator so that each load/store peer's
// part is mapped here.
#pragma once

#include <c10/core/Allocator.h>
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace nccl_core {

class Communicator;

class PeerBuffer {
 public:
  // Collective over `comm`: every rank allocates `bytes` of NCCL memory,
  // zeroes it and registers it. Needs windowAddressesReadable().
  PeerBuffer(Communicator& comm, size_t bytes);
  PeerBuffer(const PeerBuffer&) = delete;
  PeerBuffer& operator=(const PeerBuffer&) = delete;

  void* local() const {
    return memory_.get();
  }
  size_t size() const {
    return bytes_;
  }
  // World rank `peer`'s part, as mapped here; 0 when `peer` is not
  // load/store reachable.
  uintptr_t remote(int peer) const {
    return remote_.at(peer);
  }

 private:
  // The window is released by the communicator's abort, which must come
  // first: the owner destroys this after aborting the communicator.
  c10::DataPtr memory_;
  size_t bytes_;
  std::vector<uintptr_t> remote_;
};

// Staging memory every load/store peer maps, with the streams that work on
// it: `copies` writes peers' staging (copy engine only, so nothing else may
// delay the next copy), `gate` waits until a peer freed a slot, `signals`
// says a chunk arrived, `reductions` consumes this rank's staging. Owned by
// the communicator, so that its abort can let them finish before NCCL unmaps
// the peers' memory they write to.
class Staging {
 public:
  // Collective, like PeerBuffer.
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

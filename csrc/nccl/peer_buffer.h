// Device memory of this package's own (signal counters, staging), registered
// as a window on every rank of a communicator so that each load/store peer's
// part is mapped here.
#pragma once

#include <c10/core/Allocator.h>
#include <cuda_runtime_api.h>

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

} // namespace nccl_core

// The process-wide table of live device memory that ops may register with
// NCCL: NCCL allocations (ncclMemAlloc), and, once a group asks for it, the
// segments of torch's caching allocator (caching_allocator_segments.h). A
// tensor's memory is found in it, and every registration of an allocation is
// dropped before the allocation is freed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace nccl_core {

enum class MemoryKind {
  Nccl,             // ncclMemAlloc: windows and registrations
  CachingAllocator, // a segment (or mapped range) of torch's allocator
};

struct Allocation {
  uintptr_t base;
  size_t size;
  // Unique for the life of the process: a freed and reused address gets a new
  // id, so nothing keyed by id can match a stale allocation.
  uint64_t id;
  int device;
  MemoryKind kind = MemoryKind::Nccl;
  // This package's own kernels on any stream use it (signal counters,
  // staging): its free waits for the device (markDeviceWide).
  bool deviceWide = false;
  // One tensor's own (torch_nccl_core.empty): freed with that tensor, its
  // range never handed to another one.
  bool perTensor = false;
};

// Told when an allocation is about to be freed; holds no lock of the table.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void onFree(const Allocation& allocation) noexcept = 0;
};

// Records memory of `kind` at [ptr, ptr + size). A caching-allocator segment
// never replaces NCCL memory recorded at the same address (a MemPool hands it
// out), nor the same segment seen twice; where the record is `current` (told
// as it happened, not read from an older snapshot), it replaces a stale one
// of another size there, whose registrations go first. `perTensor`: see
// Allocation.
void recordAllocation(
    void* ptr,
    size_t size,
    int device,
    MemoryKind kind = MemoryKind::Nccl,
    bool current = true,
    bool perTensor = false);

// Removes the NCCL allocation at `ptr` and tells every live observer, before
// the caller frees the memory.
void forgetAllocation(void* ptr);

// Removes every allocation of `kind` that overlaps [ptr, ptr + size), and
// tells every live observer of each.
void forgetAllocations(const void* ptr, size_t size, MemoryKind kind);

// How many allocations of `kind` are recorded; lock-free.
size_t allocationCount(MemoryKind kind);

// The allocation holding [ptr, ptr + bytes), if that range is NCCL memory.
std::optional<Allocation> findAllocation(const void* ptr, size_t bytes);

// Notes that this package's kernels on any stream use the allocation holding
// `ptr` (memory of its own that peers map), if it is NCCL memory.
void markDeviceWide(const void* ptr);

// Whether the allocation at `ptr` was marked device-wide.
bool deviceWide(const void* ptr);

// Notes that an op on `stream` reached peers through a window over the
// allocation holding `ptr` (a put through this rank's mapping of their
// parts): freeing the allocation releases the window, which unmaps them, so
// the free waits for `stream` too. Cheap once the stream is known.
void noteWindowUse(const void* ptr, cudaStream_t stream);

// The streams noted for the allocation at `ptr`.
std::vector<cudaStream_t> windowUsers(const void* ptr);

// Observers are held weakly: one that is destroyed simply stops hearing.
void addAllocationObserver(std::weak_ptr<AllocationObserver> observer);

} // namespace nccl_core

// The process-wide table of live device memory that ops may register with
// NCCL: NCCL allocations (ncclMemAlloc), and, once a group asks for it, the
// segments of torch's caching allocator (caching_allocator_segments.h). A
// tensor's memory is found in it, and every registration of an allocation is
// dropped before the allocation is freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

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
  // A window was registered over it: peers map it and kernels on any stream
  // may use it, and freeing it closes windows, collectively (so the free
  // waits for the device rather than for a later, unordered moment).
  bool windowed = false;
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

// Notes that a window covers the allocation holding `ptr`, if it is NCCL
// memory.
void markWindowed(const void* ptr);

// Whether a window was ever registered over the allocation at `ptr`.
bool windowed(const void* ptr);

// Observers are held weakly: one that is destroyed simply stops hearing.
void addAllocationObserver(std::weak_ptr<AllocationObserver> observer);

} // namespace nccl_core

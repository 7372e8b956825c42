// The segments of torch's CUDA caching allocator in the allocation table
// (allocations.h), so that ops on ordinary tensors can register their memory
// with NCCL and every registration is dropped when torch frees the segment.
// The way torch's own NCCL backend tracks them
// (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK): an allocator trace tracker.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace nccl_core {

// What the tracker hears of a segment (torch's TraceEntry actions), and a
// segment found in torch's snapshot (Existing: possibly older than a record).
enum class SegmentEvent { Allocated, Mapped, Freed, Unmapped, Existing };

// The table's record of one event: an allocated segment or mapped range
// (expandable segments map theirs piece by piece) becomes an allocation, a
// freed or unmapped range drops every allocation it overlaps, an existing
// segment is recorded where nothing is.
void noteSegmentEvent(
    SegmentEvent event,
    uintptr_t address,
    size_t size,
    int device);

// Attaches the tracker to torch's caching allocator, once per process (torch
// cannot detach one), and records the segments that exist already (those of
// expandable segments are left out: their mapped ranges are not in torch's
// snapshot). Later segments are recorded as torch allocates them; frees are
// heard before torch releases the memory, unmaps right after. False, with a
// warning, where torch runs another allocator (cudaMallocAsync, a pluggable
// one), whose segments cannot be tracked.
bool trackCachingAllocatorSegments();

// A segment of torch's caching allocator.
struct Segment {
  uintptr_t address;
  size_t size;
  int device;
};

// The segments torch's allocator holds now in memory pool `pool`.
std::vector<Segment> segmentsOfPool(c10::MempoolId_t pool);

} // namespace nccl_core

#include "nccl/caching_allocator_segments.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>

#include "nccl/allocations.h"

namespace nccl_core {

namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;

// Called by torch with its allocator's lock held: it touches only the
// allocation table, and its observers close NCCL registrations (as torch's
// own deregistration hook does).
void onTrace(const allocator::TraceEntry& entry) {
  using Action = allocator::TraceEntry::Action;
  switch (entry.action_) {
    case Action::SEGMENT_ALLOC:
      noteSegmentEvent(
          SegmentEvent::Allocated, entry.addr_, entry.size_, entry.device_);
      break;
    case Action::SEGMENT_MAP:
      noteSegmentEvent(
          SegmentEvent::Mapped, entry.addr_, entry.size_, entry.device_);
      break;
    case Action::SEGMENT_FREE: {
      // torch's cudaFree right after waits for the device anyway; waiting
      // first means no registration goes under a kernel still using it.
      const c10::cuda::CUDAGuard guard(entry.device_);
      C10_CUDA_CHECK_WARN(cudaDeviceSynchronize());
      noteSegmentEvent(
          SegmentEvent::Freed, entry.addr_, entry.size_, entry.device_);
      break;
    }
    case Action::SEGMENT_UNMAP:
      noteSegmentEvent(
          SegmentEvent::Unmapped, entry.addr_, entry.size_, entry.device_);
      break;
    default:
      break;
  }
}

} // namespace

void noteSegmentEvent(
    SegmentEvent event,
    uintptr_t address,
    size_t size,
    int device) {
  void* ptr = reinterpret_cast<void*>(address);
  if (event == SegmentEvent::Allocated || event == SegmentEvent::Mapped) {
    recordAllocation(ptr, size, device, MemoryKind::CachingAllocator);
  } else {
    forgetAllocations(ptr, size, MemoryKind::CachingAllocator);
  }
}

void trackCachingAllocatorSegments() {
  static std::once_flag attached;
  std::call_once(attached, [] {
    // torch makes its per-device allocators at CUDA's lazy initialization,
    // and a tracker attached before that reaches none of them: made now
    // (idempotent, as torch's own initialization calls it).
    allocator::init(c10::cuda::device_count());
    // Attached first: a segment made meanwhile is recorded by both, once.
    allocator::attachAllocatorTraceTracker(&onTrace);
    const auto snapshot = allocator::snapshot({0, 0}, /*include_traces=*/false);
    for (const auto& segment : snapshot.segments) {
      if (!segment.is_expandable) {
        noteSegmentEvent(
            SegmentEvent::Allocated,
            segment.address,
            segment.total_size,
            segment.device);
      }
    }
  });
}

std::vector<Segment> segmentsOfPool(c10::MempoolId_t pool) {
  std::vector<Segment> segments;
  const auto snapshot = allocator::snapshot(pool, /*include_traces=*/false);
  for (const auto& segment : snapshot.segments) {
    if (segment.owner_private_pool_id == pool) {
      segments.push_back({segment.address, segment.total_size, segment.device});
    }
  }
  return segments;
}

} // namespace nccl_core

#include "nccl/caching_allocator_segments.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Logging.h>

#include <optional>
#include <string>

#include "nccl/allocations.h"

namespace nccl_core {

namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;

std::optional<SegmentEvent> eventOf(allocator::TraceEntry::Action action) {
  using Action = allocator::TraceEntry::Action;
  switch (action) {
    case Action::SEGMENT_ALLOC:
      return SegmentEvent::Allocated;
    case Action::SEGMENT_MAP:
      return SegmentEvent::Mapped;
    case Action::SEGMENT_FREE:
      return SegmentEvent::Freed;
    case Action::SEGMENT_UNMAP:
      return SegmentEvent::Unmapped;
    default:
      return std::nullopt;
  }
}

// Called by torch with its allocator's lock held: it touches only the
// allocation table, and its observers close NCCL registrations (as torch's
// own deregistration hook does).
void onTrace(const allocator::TraceEntry& entry) {
  const auto event = eventOf(entry.action_);
  if (!event) {
    return;
  }
  if (*event == SegmentEvent::Freed) {
    // torch's cudaFree right after waits for the device anyway; waiting
    // first means no registration goes under a kernel still using it. (torch
    // reports an unmap after it, having waited for the segment's stream.)
    const c10::cuda::CUDAGuard guard(entry.device_);
    C10_CUDA_CHECK_WARN(cudaDeviceSynchronize());
  }
  noteSegmentEvent(*event, entry.addr_, entry.size_, entry.device_);
}

} // namespace

void noteSegmentEvent(
    SegmentEvent event,
    uintptr_t address,
    size_t size,
    int device) {
  void* ptr = reinterpret_cast<void*>(address);
  if (event == SegmentEvent::Freed || event == SegmentEvent::Unmapped) {
    forgetAllocations(ptr, size, MemoryKind::CachingAllocator);
  } else {
    recordAllocation(
        ptr,
        size,
        device,
        MemoryKind::CachingAllocator,
        /*current=*/event != SegmentEvent::Existing);
  }
}

namespace {

bool attachTracker() {
  const std::string name = allocator::get()->name();
  if (name != "native") {
    LOG(WARNING) << "[nccl_core] torch's CUDA allocator is '" << name
                 << "', whose segments cannot be tracked: ops on ordinary "
                    "tensors run unregistered";
    return false;
  }
  // torch makes its per-device allocators at CUDA's lazy initialization,
  // and a tracker attached before that reaches none of them: made now
  // (idempotent, as torch's own initialization calls it).
  allocator::init(c10::cuda::device_count());
  // Attached first: a segment made meanwhile is recorded by both, once.
  allocator::attachAllocatorTraceTracker(&onTrace);
  try {
    const auto snapshot = allocator::snapshot({0, 0}, /*include_traces=*/false);
    for (const auto& segment : snapshot.segments) {
      if (!segment.is_expandable) {
        noteSegmentEvent(
            SegmentEvent::Existing,
            segment.address,
            segment.total_size,
            segment.device);
      }
    }
  } catch (const std::exception& e) {
    LOG(WARNING) << "[nccl_core] the segments torch's allocator holds already "
                    "stay untracked (run unregistered): "
                 << e.what();
  }
  return true;
}

} // namespace

bool trackCachingAllocatorSegments() {
  static const bool tracked = attachTracker();
  return tracked;
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

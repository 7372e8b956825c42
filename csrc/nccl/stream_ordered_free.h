// Stream-ordered release of NCCL memory, the caching allocator's contract: a
// freed allocation goes back to NCCL (its registrations dropped first) once
// the work enqueued so far on the streams that used it is done. Never a
// device-wide synchronize: that would wait for other groups' collectives too,
// whose peers may be waiting for this thread's next op (a cycle no timeout
// but the watchdog's ends).
#pragma once

#include <c10/util/ArrayRef.h>
#include <cuda_runtime_api.h>

namespace nccl_core {

// Frees `ptr` (ncclMemAlloc memory on `device`) once `streams`, and the
// streams that put through a window over it (noteWindowUse), finished what
// they hold now: at once where they are idle, else at this thread's next
// allocation or free of NCCL memory or op of a group, or when it exits, and at
// the latest before its next window registration (waiting for the streams
// then: every rank's windows must come and go in one order); the host never
// waits here. A stream capturing now is waited for from the end of its
// capture. Its windows close when it goes (NCCL deregisters a window locally;
// peers keep their mappings of this rank's memory, which CUDA keeps alive
// until they unmap it). Memory this package's kernels use from any
// stream (markDeviceWide) goes at once, after a device-wide synchronize.
// `mayReleaseGil`: no lock of torch's is held, so that wait may let go of
// Python's GIL.
void freeAfter(
    void* ptr,
    int device,
    c10::ArrayRef<cudaStream_t> streams,
    bool mayReleaseGil) noexcept;

// Frees the allocations this thread freed whose streams have finished; with
// `wait`, waits for them first (before retrying an allocation that ran out of
// memory). Frees are released on the thread that made them: the
// registrations they drop belong to communicators that thread uses.
void freeFinished(bool wait) noexcept;

} // namespace nccl_core

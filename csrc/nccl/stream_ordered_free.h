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

// Frees `ptr` (ncclMemAlloc memory on `device`) once `streams` finished what
// they hold now: at once where they are idle, else on a later allocation or
// free of NCCL memory. A stream under capture is not waited for. Memory a
// window covers goes at once, after a device-wide synchronize: peers map it,
// kernels on any stream may use it, and its windows are closed collectively,
// at the same point on every rank. `mayReleaseGil`: no lock of torch's is
// held, so that wait may let go of Python's GIL.
void freeAfter(
    void* ptr,
    int device,
    c10::ArrayRef<cudaStream_t> streams,
    bool mayReleaseGil) noexcept;

// Frees the allocations whose streams have finished; with `wait`, waits for
// all of them first (before retrying an allocation that ran out of memory).
void freeFinished(bool wait) noexcept;

} // namespace nccl_core

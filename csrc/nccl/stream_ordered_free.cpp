#include "nccl/stream_ordered_free.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <vector>

#include "nccl/allocations.h"
#include "nccl/api.h"
#include "nccl/blocking_wait.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

// One freed allocation, and the streams whose work up to the free it waits
// for: an event each, recorded at the free, or later for a stream that was
// capturing then (`unrecorded`: its eager work is ordered before the capture
// ends, and a graph that uses freed memory is the caller's error).
struct Pending {
  void* ptr;
  int device;
  std::vector<cudaEvent_t> events;
  std::vector<cudaStream_t> unrecorded;
};

// Relaxed capture mode while queries and records run, so that neither this
// thread's nor another thread's global-mode capture is invalidated by them.
class RelaxedCapture {
 public:
  RelaxedCapture() {
    C10_CUDA_CHECK_WARN(cudaThreadExchangeStreamCaptureMode(&mode_));
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
  ~RelaxedCapture() {
    C10_CUDA_CHECK_WARN(cudaThreadExchangeStreamCaptureMode(&mode_));
  }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK_WARN(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool done(cudaError_t state) {
  if (state != cudaSuccess) {
    (void)cudaGetLastError(); // cudaErrorNotReady is no error
  }
  return state == cudaSuccess;
}

void freeNow(void* ptr, int device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Registrations first: NCCL must not keep a handle to an address that a
  // later allocation may reuse.
  forgetAllocation(ptr);
  NCCL_CORE_WARN(realNccl(), realNccl().memFree(ptr));
}

void synchronizeDevice(void* /*unused*/) {
  C10_CUDA_CHECK_WARN(cudaDeviceSynchronize());
}

void freeAfterDevice(void* ptr, int device, bool mayReleaseGil) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  if (mayReleaseGil) {
    runBlockingWait(synchronizeDevice, nullptr);
  } else {
    synchronizeDevice(nullptr);
  }
  freeNow(ptr, device);
}

void release(Pending& entry) {
  for (cudaEvent_t event : entry.events) {
    C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
  }
  freeNow(entry.ptr, entry.device);
}

// Records an event on each of `entry`'s unrecorded streams that does not
// capture; false if CUDA cannot (interpreter exit): nothing runs any more.
bool recordOnStreams(Pending& entry) {
  if (entry.unrecorded.empty()) {
    return true;
  }
  // On the memory's device: a default stream's handle names the current
  // device's.
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(entry.device));
  auto still = entry.unrecorded.begin();
  for (cudaStream_t stream : entry.unrecorded) {
    if (capturing(stream)) {
      *still++ = stream;
      continue;
    }
    cudaEvent_t event = nullptr;
    if (!done(cudaEventCreateWithFlags(&event, cudaEventDisableTiming))) {
      return false;
    }
    if (!done(cudaEventRecord(event, stream))) {
      // A stream destroyed since it put through a window holds nothing more
      // to wait for; the others still count.
      C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
      continue;
    }
    entry.events.push_back(event);
  }
  entry.unrecorded.erase(still, entry.unrecorded.end());
  return true;
}

bool finished(const Pending& entry) {
  return entry.unrecorded.empty() &&
         std::all_of(entry.events.begin(), entry.events.end(), [](auto event) {
           return done(cudaEventQuery(event));
         });
}

// The freeing thread's own: the registrations a release drops are dropped on
// the thread that freed the memory, as when frees were synchronous, never on
// a thread that may be enqueueing on another thread's communicator. A thread
// that exits waits for what it left (errors ignored: CUDA may be going).
struct Queue {
  std::vector<Pending> entries;
  ~Queue() {
    if (!entries.empty()) {
      (void)cudaDeviceSynchronize();
    }
    for (Pending& entry : entries) {
      for (cudaEvent_t event : entry.events) {
        (void)cudaEventDestroy(event);
      }
      forgetAllocation(entry.ptr);
      (void)realNccl().memFree(entry.ptr);
    }
  }
};

Queue& queue() {
  thread_local Queue instance;
  return instance;
}

} // namespace

void freeAfter(
    void* ptr,
    int device,
    c10::ArrayRef<cudaStream_t> streams,
    bool mayReleaseGil) noexcept {
  if (deviceWide(ptr)) {
    // This package's kernels on any stream may use it: the device first.
    freeAfterDevice(ptr, device, mayReleaseGil);
    return;
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const RelaxedCapture relaxed;
  Pending entry{ptr, device, {}, {}};
  // A window over it goes with it, unmapping the peers' parts that puts on
  // these streams write through.
  const std::vector<cudaStream_t> users = windowUsers(ptr);
  std::vector<cudaStream_t> all(streams.begin(), streams.end());
  all.insert(all.end(), users.begin(), users.end());
  for (cudaStream_t stream : all) {
    // A capturing stream is never queried: that would end its capture.
    if (std::find(entry.unrecorded.begin(), entry.unrecorded.end(), stream) ==
            entry.unrecorded.end() &&
        (capturing(stream) || !done(cudaStreamQuery(stream)))) {
      entry.unrecorded.push_back(stream); // busy or capturing: an event each
    }
  }
  if (entry.unrecorded.empty()) {
    freeNow(ptr, device); // every stream idle
  } else if (!recordOnStreams(entry)) {
    release(entry);
  } else {
    queue().entries.push_back(std::move(entry));
  }
  freeFinished(false);
}

void freeFinished(bool wait) noexcept {
  std::vector<Pending>& entries = queue().entries;
  if (entries.empty()) {
    return;
  }
  const RelaxedCapture relaxed;
  // Released after the scan: a release may free more NCCL memory on this
  // thread (a resource that held some), which joins `entries` meanwhile.
  std::vector<Pending> ready;
  std::vector<Pending> kept;
  for (Pending& entry : entries) {
    const bool recorded = recordOnStreams(entry);
    if (wait && recorded && entry.unrecorded.empty()) {
      for (cudaEvent_t event : entry.events) {
        C10_CUDA_CHECK_WARN(cudaEventSynchronize(event));
      }
    }
    (!recorded || finished(entry) ? ready : kept).push_back(std::move(entry));
  }
  entries = std::move(kept);
  for (Pending& entry : ready) {
    release(entry);
  }
}

} // namespace nccl_core

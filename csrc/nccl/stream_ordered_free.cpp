#include "nccl/stream_ordered_free.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <vector>

#include "nccl/allocations.h"
#include "nccl/api.h"
#include "nccl/blocking_wait.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

struct Pending {
  void* ptr;
  int device;
  std::vector<cudaEvent_t> events; // recorded on the streams that used it
};

struct Queue {
  std::mutex mutex;
  std::list<Pending> entries;
  // Lets allocations skip the lock while nothing waits.
  std::atomic<size_t> size{0};
};

Queue& queue() {
  // Never destroyed: NCCL memory may be freed during interpreter exit.
  static auto* instance = new Queue();
  return *instance;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK_WARN(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// The streams that can be waited for: one under capture holds work that runs
// at replay, which a graph using freed memory makes the caller's error.
std::vector<cudaStream_t> waitable(c10::ArrayRef<cudaStream_t> streams) {
  std::vector<cudaStream_t> result;
  for (cudaStream_t stream : streams) {
    if (!capturing(stream) &&
        std::find(result.begin(), result.end(), stream) == result.end()) {
      result.push_back(stream);
    }
  }
  return result;
}

bool idle(const std::vector<cudaStream_t>& streams) {
  for (cudaStream_t stream : streams) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state != cudaSuccess) {
      (void)cudaGetLastError(); // cudaErrorNotReady is no error
      return false;
    }
  }
  return true;
}

void freeNow(void* ptr, int device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Registrations first: NCCL must not keep a handle to an address a later
  // allocation may reuse.
  forgetAllocation(ptr);
  NCCL_CORE_WARN(nccl().memFree(ptr));
}

void synchronizeDevice(void* /*unused*/) {
  C10_CUDA_CHECK_WARN(cudaDeviceSynchronize());
}

bool finished(const Pending& entry) {
  for (cudaEvent_t event : entry.events) {
    const cudaError_t state = cudaEventQuery(event);
    if (state != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
  }
  return true;
}

void release(Pending& entry) {
  for (cudaEvent_t event : entry.events) {
    if (event != nullptr) {
      C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
    }
  }
  freeNow(entry.ptr, entry.device);
}

} // namespace

void freeAfter(
    void* ptr,
    int device,
    c10::ArrayRef<cudaStream_t> streams,
    bool mayReleaseGil) noexcept {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  if (windowed(ptr)) {
    // Peers map it, and kernels on any stream (one-sided waits, the
    // engines') may use it: the device finishes first, as before any free of
    // memory a window covers.
    if (mayReleaseGil) {
      runBlockingWait(synchronizeDevice, nullptr);
    } else {
      synchronizeDevice(nullptr);
    }
    freeNow(ptr, device);
    return;
  }
  const std::vector<cudaStream_t> ordered = waitable(streams);
  if (idle(ordered)) {
    freeNow(ptr, device);
    freeFinished(false);
    return;
  }
  Pending entry{ptr, device, {}};
  for (cudaStream_t stream : ordered) {
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) !=
            cudaSuccess ||
        cudaEventRecord(event, stream) != cudaSuccess) {
      // CUDA is going (interpreter exit) or broken: nothing runs any more.
      (void)cudaGetLastError();
      entry.events.push_back(event);
      release(entry);
      return;
    }
    entry.events.push_back(event);
  }
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    q.entries.push_back(std::move(entry));
    q.size.store(q.entries.size(), std::memory_order_release);
  }
  freeFinished(false);
}

void freeFinished(bool wait) noexcept {
  Queue& q = queue();
  if (q.size.load(std::memory_order_acquire) == 0) {
    return;
  }
  std::list<Pending> done;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    for (auto it = q.entries.begin(); it != q.entries.end();) {
      auto next = std::next(it);
      if (wait || finished(*it)) {
        done.splice(done.end(), q.entries, it);
      }
      it = next;
    }
    q.size.store(q.entries.size(), std::memory_order_release);
  }
  // Outside the lock: dropping registrations calls into NCCL.
  for (Pending& entry : done) {
    for (cudaEvent_t event : entry.events) {
      C10_CUDA_CHECK_WARN(cudaEventSynchronize(event));
    }
    release(entry);
  }
}

} // namespace nccl_core

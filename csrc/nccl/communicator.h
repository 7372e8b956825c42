// Move-only RAII owner of one ncclComm_t. Nothing outside csrc/nccl calls
// ncclComm* directly.
#pragma once

#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace nccl_core {

class Communicator {
 public:
  // Collective over the `nranks` processes that share `id`.
  static std::shared_ptr<Communicator> create(
      int nranks,
      int rank,
      const ncclUniqueId& id,
      int device,
      ncclConfig_t config);

  // ncclCommSplit, collective over this communicator. Returns nullptr on a
  // rank that passes color < 0 (it joins no new communicator).
  std::shared_ptr<Communicator> split(int color, int key, ncclConfig_t config);

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  // The raw handle, for enqueueing operations. Throws DistBackendError once
  // the communicator was aborted.
  ncclComm_t get() const;

  int rank() const {
    return rank_;
  }
  int size() const {
    return size_;
  }
  int device() const {
    return device_;
  }
  bool isAborted() const {
    return aborted_.load(std::memory_order_acquire);
  }

  // Frees the communicator and makes any operation still running on it
  // return. Idempotent, never throws, never waits for peers.
  void abort() noexcept;

  // The asynchronous error NCCL recorded, ncclSuccess when there is none.
  ncclResult_t asyncError() const;

 private:
  Communicator(ncclComm_t comm, int rank, int size, int device);

  ncclComm_t comm_;
  const int rank_;
  const int size_;
  const int device_;
  std::atomic<bool> aborted_{false};
  std::mutex abortMutex_;
};

} // namespace nccl_core

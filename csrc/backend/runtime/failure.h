// The failure record of one backend: set once (by the watchdog on a timeout,
// an asynchronous NCCL error or a peer's abort, or by abort()), then raised as
// DistBackendError by every later op and wait().
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include <c10/macros/Macros.h>

namespace nccl_core {

// What an op that failed because of `cause` reports: "<label> failed:
// <cause>", or `cause` alone where it names this op already (the group
// failed at this very op).
std::string opFailure(const std::string& label, const std::string& cause);

class FailureState {
 public:
  bool failed() const {
    return failed_.load(std::memory_order_acquire);
  }

  // Records `message` unless a failure was recorded already; true if it was
  // the first.
  bool set(std::string message);

  std::string message() const;

  [[noreturn]] void raise() const;

  void raiseIfFailed() const {
    if (C10_UNLIKELY(failed())) {
      raise();
    }
  }

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  std::string message_;
};

} // namespace nccl_core

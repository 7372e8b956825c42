#include "backend/runtime/failure.h"

#include <c10/util/Exception.h>

namespace nccl_core {

bool FailureState::set(std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) {
    return false;
  }
  message_ = std::move(message);
  failed_.store(true, std::memory_order_release);
  return true;
}

std::string FailureState::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

void FailureState::raise() const {
  C10_THROW_ERROR(DistBackendError, message());
}

} // namespace nccl_core

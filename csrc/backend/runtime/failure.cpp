#include "backend/runtime/failure.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

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

std::string opFailure(const std::string& label, const std::string& cause) {
  // "(seq 16) on group 'g'", or "(seq 3, peer 1) on group 'g'": how every
  // description of an op ends, whatever it calls the op before.
  const size_t seq = label.find("(seq ");
  if (seq != std::string::npos &&
      cause.find(label.substr(seq)) != std::string::npos) {
    return cause;
  }
  return c10::str(label, " failed: ", cause);
}

} // namespace nccl_core

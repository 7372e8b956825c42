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
  // The op's number and group as every label spells them ("(seq 16" then
  // ", peer 1" or ")", and " on group 'g'"), whether or not the cause calls
  // it synchronous.
  const std::string causeOp = cause.substr(0, cause.find(" failed: "));
  const size_t seq = label.find("(seq ");
  const size_t group = label.rfind(" on group '");
  if (seq != std::string::npos && group != std::string::npos &&
      causeOp.size() != cause.size()) {
    const std::string number =
        label.substr(seq, label.find_first_of(",)", seq) - seq);
    const std::string onGroup = label.substr(group);
    const size_t at = causeOp.find(number);
    const size_t end = at + number.size();
    if (at != std::string::npos && end < causeOp.size() &&
        (causeOp[end] == ')' || causeOp[end] == ',') &&
        causeOp.size() >= onGroup.size() &&
        causeOp.compare(
            causeOp.size() - onGroup.size(), onGroup.size(), onGroup) == 0) {
      return cause;
    }
  }
  return c10::str(label, " failed: ", cause);
}

} // namespace nccl_core

#include "backend/abort_hooks.h"

#include <c10/util/Logging.h>

#include <exception>
#include <utility>

namespace nccl_core {

void AbortHooks::add(int64_t id, std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  hooks_[id] = std::move(hook);
}

void AbortHooks::remove(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  hooks_.erase(id);
}

void AbortHooks::run(const std::string& group) noexcept {
  std::map<int64_t, std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks = hooks_;
  }
  for (const auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      LOG(ERROR) << "[nccl_core] abort hook " << id << " of group '" << group
                 << "' failed: " << e.what();
    } catch (...) {
      LOG(ERROR) << "[nccl_core] abort hook " << id << " of group '" << group
                 << "' failed";
    }
  }
}

} // namespace nccl_core

// Callbacks torch registers on a backend (c10d::Backend's hook API,
// torch/csrc/distributed/c10d/Hooks.hpp): abort hooks (torch >= 2.14) run
// before the watchdog aborts the group on a timeout or an error; completion
// hooks (torch >= 2.15) run when it sees an async op finish successfully.
// torch's FlightRecorderHook uses both: it dumps its trace from the abort hook
// and marks entries completed from the completion hook.
#pragma once

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/headeronly/version.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#define NCCL_CORE_HAS_COMPLETION_HOOKS \
  (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 15)

namespace nccl_core {

// Hooks by id, run in id order (as torch's ProcessGroup runs its own hooks).
template <typename... Args>
class HookTable {
 public:
  // Adds `hook` under `id`, replacing one of the same id.
  void add(int64_t id, std::function<void(Args...)> hook) {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks_[id] = std::move(hook);
    any_.store(true, std::memory_order_release);
  }
  // A no-op for an id that has no hook.
  void remove(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks_.erase(id);
    any_.store(!hooks_.empty(), std::memory_order_release);
  }
  // Lock-free, for the watchdog's per-op path.
  bool empty() const {
    return !any_.load(std::memory_order_acquire);
  }
  // Runs every hook outside the lock (a hook may take long or register
  // another). One that throws is logged and the others still run.
  void run(const char* kind, const std::string& group, Args... args) noexcept {
    std::map<int64_t, std::function<void(Args...)>> hooks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hooks = hooks_;
    }
    for (const auto& [id, hook] : hooks) {
      try {
        hook(args...);
      } catch (const std::exception& e) {
        LOG(ERROR) << "[nccl_core] " << kind << " hook " << id << " of group '"
                   << group << "' failed: " << e.what();
      } catch (...) {
        LOG(ERROR) << "[nccl_core] " << kind << " hook " << id << " of group '"
                   << group << "' failed";
      }
    }
  }

 private:
  std::mutex mutex_;
  std::map<int64_t, std::function<void(Args...)>> hooks_;
  std::atomic<bool> any_{false};
};

struct BackendHooks {
  HookTable<> abort;
#if NCCL_CORE_HAS_COMPLETION_HOOKS
  HookTable<const c10d::CompletionHookArgs&> completion;
#endif
};

} // namespace nccl_core

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
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#define NCCL_CORE_HAS_COMPLETION_HOOKS \
  (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 15)

namespace nccl_core {

// Hooks by id, run in id order (as torch's ProcessGroup runs its own hooks).
// A hook made from a Python callable takes the GIL when it is copied or
// destroyed, so hooks are shared, never copied, and a replaced or removed one
// is released outside the lock: a thread registering a hook with the GIL held
// then never waits for one that needs the GIL.
template <typename... Args>
class HookTable {
 public:
  using Hook = std::function<void(Args...)>;

  // Adds `hook` under `id`, replacing one of the same id.
  void add(int64_t id, Hook hook) {
    auto added = std::make_shared<const Hook>(std::move(hook));
    std::shared_ptr<const Hook> replaced;
    std::lock_guard<std::mutex> lock(mutex_);
    replaced = std::exchange(hooks_[id], std::move(added));
    any_.store(true, std::memory_order_release);
  }
  // A no-op for an id that has no hook.
  void remove(int64_t id) {
    std::shared_ptr<const Hook> removed;
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto found = hooks_.find(id); found != hooks_.end()) {
      removed = std::move(found->second);
      hooks_.erase(found);
    }
    any_.store(!hooks_.empty(), std::memory_order_release);
  }
  // Lock-free, for the watchdog's per-op path.
  bool empty() const {
    return !any_.load(std::memory_order_acquire);
  }
  // Runs every hook outside the lock (a hook may take long or register
  // another). One that throws is logged and the others still run.
  void run(const char* kind, const std::string& group, Args... args) noexcept {
    std::map<int64_t, std::shared_ptr<const Hook>> hooks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hooks = hooks_;
    }
    for (const auto& [id, hook] : hooks) {
      try {
        (*hook)(args...);
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
  std::map<int64_t, std::shared_ptr<const Hook>> hooks_;
  std::atomic<bool> any_{false};
};

struct BackendHooks {
  HookTable<> abort;
#if NCCL_CORE_HAS_COMPLETION_HOOKS
  HookTable<const c10d::CompletionHookArgs&> completion;
#endif
};

} // namespace nccl_core

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
// The table is an immutable snapshot replaced on every change, so a run (once
// per finished op for completion hooks) takes one reference instead of
// copying it. A hook made from a Python callable takes the GIL when it is
// destroyed, so a replaced snapshot is released outside the lock: a thread
// registering a hook with the GIL held then never waits for one that needs it.
template <typename... Args>
class HookTable {
 public:
  using Hook = std::function<void(Args...)>;

  // Adds `hook` under `id`, replacing one of the same id.
  void add(int64_t id, Hook hook) {
    auto added = std::make_shared<const Hook>(std::move(hook));
    std::shared_ptr<const Table> replaced;
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = std::make_shared<Table>(*table_);
    (*next)[id] = std::move(added);
    replaced = std::exchange(table_, std::move(next));
    any_.store(true, std::memory_order_release);
  }
  // A no-op for an id that has no hook.
  void remove(int64_t id) {
    std::shared_ptr<const Table> replaced;
    std::lock_guard<std::mutex> lock(mutex_);
    if (table_->count(id) == 0) {
      return;
    }
    auto next = std::make_shared<Table>(*table_);
    next->erase(id);
    any_.store(!next->empty(), std::memory_order_release);
    replaced = std::exchange(table_, std::move(next));
  }
  // Lock-free, for the watchdog's per-op path.
  bool empty() const {
    return !any_.load(std::memory_order_acquire);
  }
  // Runs every hook outside the lock (a hook may take long or register
  // another). One that throws is logged and the others still run.
  void run(const char* kind, const std::string& group, Args... args) noexcept {
    std::shared_ptr<const Table> table;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      table = table_;
    }
    for (const auto& [id, hook] : *table) {
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
  using Table = std::map<int64_t, std::shared_ptr<const Hook>>;

  std::mutex mutex_;
  std::shared_ptr<const Table> table_ = std::make_shared<const Table>();
  std::atomic<bool> any_{false};
};

struct BackendHooks {
  HookTable<> abort;
#if NCCL_CORE_HAS_COMPLETION_HOOKS
  HookTable<const c10d::CompletionHookArgs&> completion;
#endif
};

} // namespace nccl_core

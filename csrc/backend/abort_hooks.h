// Callbacks run before a backend aborts its communicator on a timeout or an
// error (c10d::Backend's abort-hook API, torch/csrc/distributed/c10d/Hooks.hpp,
// torch >= 2.14): users capture debug state there, and torch 2.15's
// FlightRecorderHook writes its trace.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace nccl_core {

class AbortHooks {
 public:
  // Adds `hook` under `id`, replacing one of the same id.
  void add(int64_t id, std::function<void()> hook);
  // A no-op for an id that has no hook.
  void remove(int64_t id);
  // Runs every hook in id order, outside the lock (a hook may take long or
  // register another). One that throws is logged and the others still run.
  void run(const std::string& group) noexcept;

 private:
  std::mutex mutex_;
  std::map<int64_t, std::function<void()>> hooks_;
};

} // namespace nccl_core

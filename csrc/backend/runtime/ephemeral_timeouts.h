// Temporary extensions of a group's timeout (c10d::Backend::
// addEphemeralTimeout, torch >= 2.14). torch.compile adds one on each cache
// hit, as long as the compilation the hit saved, so that ranks that hit the
// cache do not time out waiting for ranks that compile. As in torch's
// ProcessGroupNCCL, an extension lengthens the timeout of every op issued
// while it lasts and ends once the first op issued after it finished (here:
// once every op up to that one finished, never earlier). Synchronous ops,
// which the watchdog times together, get the extensions in force when it
// looks.
#pragma once

#include <torch/headeronly/version.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

// c10d::Backend::addEphemeralTimeout exists from torch 2.14 on.
#define NCCL_CORE_HAS_EPHEMERAL_TIMEOUTS \
  (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 14)

namespace nccl_core {

class EphemeralTimeouts {
 public:
  // Caller thread: `amount` more for the ops from `firstSeq` (the next op's
  // number) on.
  void add(std::chrono::milliseconds amount, uint64_t firstSeq) {
    if (amount.count() <= 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    extensions_.emplace_back(firstSeq, amount);
    activeMs_.fetch_add(amount.count(), std::memory_order_relaxed);
  }

  // The extensions in force: one atomic load, on every op.
  std::chrono::milliseconds active() const {
    return std::chrono::milliseconds(activeMs_.load(std::memory_order_relaxed));
  }

  // Watchdog: every op numbered below `seq` finished; the extensions whose
  // first op is among them end.
  void finishedBelow(uint64_t seq) {
    if (activeMs_.load(std::memory_order_relaxed) == 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // Added in order of their first op: the ended ones are at the front.
    while (!extensions_.empty() && extensions_.front().first < seq) {
      activeMs_.fetch_sub(
          extensions_.front().second.count(), std::memory_order_relaxed);
      extensions_.pop_front();
    }
  }

 private:
  std::mutex mutex_;
  std::deque<std::pair<uint64_t, std::chrono::milliseconds>> extensions_;
  std::atomic<int64_t> activeMs_{0};
};

} // namespace nccl_core

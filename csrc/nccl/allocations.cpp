#include "nccl/allocations.h"

#include <atomic>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace nccl_core {

namespace {

struct Table {
  // Read by every op that touches NCCL memory; written on allocation and free.
  std::shared_mutex mutex;
  std::map<uintptr_t, Allocation> byBase;
  std::vector<std::weak_ptr<AllocationObserver>> observers;
  uint64_t nextId = 1;
  // Lets ops on ordinary memory skip the lock while no NCCL memory exists.
  std::atomic<size_t> count{0};
};

Table& table() {
  // Never destroyed: NCCL memory may be freed during interpreter exit, after
  // static destructors would have run.
  static Table* instance = new Table();
  return *instance;
}

} // namespace

void recordAllocation(void* ptr, size_t size, int device) {
  Table& t = table();
  std::lock_guard<std::shared_mutex> lock(t.mutex);
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  t.byBase[base] = Allocation{base, size, t.nextId++, device, false};
  t.count.store(t.byBase.size(), std::memory_order_release);
}

void forgetAllocation(void* ptr) {
  Table& t = table();
  std::optional<Allocation> gone;
  std::vector<std::shared_ptr<AllocationObserver>> observers;
  {
    std::lock_guard<std::shared_mutex> lock(t.mutex);
    auto it = t.byBase.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == t.byBase.end()) {
      return;
    }
    gone = it->second;
    t.byBase.erase(it);
    t.count.store(t.byBase.size(), std::memory_order_release);
    auto live = t.observers.begin();
    for (auto& weak : t.observers) {
      if (auto observer = weak.lock()) {
        observers.push_back(std::move(observer));
        *live++ = std::move(weak);
      }
    }
    t.observers.erase(live, t.observers.end());
  }
  for (const auto& observer : observers) {
    observer->onFree(*gone);
  }
}

std::optional<Allocation> findAllocation(const void* ptr, size_t bytes) {
  Table& t = table();
  if (t.count.load(std::memory_order_acquire) == 0) {
    return std::nullopt;
  }
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  auto it = t.byBase.upper_bound(address);
  if (it == t.byBase.begin()) {
    return std::nullopt;
  }
  --it;
  const Allocation& a = it->second;
  if (address + bytes > a.base + a.size) {
    return std::nullopt;
  }
  return a;
}

void markWindowed(const void* ptr) {
  Table& t = table();
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::shared_mutex> lock(t.mutex);
  auto it = t.byBase.upper_bound(address);
  if (it != t.byBase.begin() &&
      address < (--it)->second.base + it->second.size) {
    it->second.windowed = true;
  }
}

bool windowed(const void* ptr) {
  Table& t = table();
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  auto it = t.byBase.find(reinterpret_cast<uintptr_t>(ptr));
  return it != t.byBase.end() && it->second.windowed;
}

void addAllocationObserver(std::weak_ptr<AllocationObserver> observer) {
  Table& t = table();
  std::lock_guard<std::shared_mutex> lock(t.mutex);
  t.observers.push_back(std::move(observer));
}

} // namespace nccl_core

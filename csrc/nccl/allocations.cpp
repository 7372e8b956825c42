#include "nccl/allocations.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
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
  // The entries of each kind, for groups that look for one kind only.
  std::atomic<size_t> byKind[2] = {0, 0};
  // The streams noteWindowUse saw, by allocation id.
  std::unordered_map<uint64_t, std::vector<cudaStream_t>> windowUsers;
};

std::atomic<size_t>& countOf(Table& t, MemoryKind kind) {
  return t.byKind[kind == MemoryKind::Nccl ? 0 : 1];
}

Table& table() {
  // Never destroyed: NCCL memory may be freed during interpreter exit, after
  // static destructors would have run.
  static Table* instance = new Table();
  return *instance;
}

// The live observers, dropping the dead ones; needs the table's lock. (No
// element is moved onto itself: a self-moved weak_ptr forgets its object.)
std::vector<std::shared_ptr<AllocationObserver>> liveObservers(Table& t) {
  t.observers.erase(
      std::remove_if(
          t.observers.begin(),
          t.observers.end(),
          [](const std::weak_ptr<AllocationObserver>& weak) {
            return weak.expired();
          }),
      t.observers.end());
  std::vector<std::shared_ptr<AllocationObserver>> observers;
  for (const auto& weak : t.observers) {
    if (auto observer = weak.lock()) {
      observers.push_back(std::move(observer));
    }
  }
  return observers;
}

// Entries taken out of the table, and the observers to tell of them once
// its lock is released.
struct Forgotten {
  std::vector<Allocation> gone;
  std::vector<std::shared_ptr<AllocationObserver>> observers;

  void tell() const {
    for (const Allocation& allocation : gone) {
      for (const auto& observer : observers) {
        observer->onFree(allocation);
      }
    }
  }
};

// Takes out the entries in [from, to) that `pick` selects; needs the lock.
template <typename Pick>
Forgotten takeWhere(Table& t, uintptr_t from, uintptr_t to, Pick pick) {
  Forgotten forgotten;
  // Entries start below `to`; the one before `from` may reach into it.
  auto it = t.byBase.upper_bound(from);
  if (it != t.byBase.begin()) {
    --it;
  }
  while (it != t.byBase.end() && it->first < to) {
    const Allocation& a = it->second;
    if (a.base + a.size > from && pick(a)) {
      t.windowUsers.erase(a.id);
      forgotten.gone.push_back(a);
      countOf(t, a.kind).fetch_sub(1, std::memory_order_release);
      it = t.byBase.erase(it);
    } else {
      ++it;
    }
  }
  if (!forgotten.gone.empty()) {
    t.count.store(t.byBase.size(), std::memory_order_release);
    forgotten.observers = liveObservers(t);
  }
  return forgotten;
}

// The entry holding `address`; needs the lock.
Allocation* covering(Table& t, uintptr_t address) {
  auto it = t.byBase.upper_bound(address);
  if (it == t.byBase.begin()) {
    return nullptr;
  }
  --it;
  return address < it->second.base + it->second.size ? &it->second : nullptr;
}

template <typename Pick>
void forgetWhere(uintptr_t from, uintptr_t to, Pick pick) {
  Table& t = table();
  Forgotten forgotten;
  {
    std::lock_guard<std::shared_mutex> lock(t.mutex);
    forgotten = takeWhere(t, from, to, pick);
  }
  forgotten.tell();
}

} // namespace

void recordAllocation(
    void* ptr,
    size_t size,
    int device,
    MemoryKind kind,
    bool current,
    bool perTensor) {
  Table& t = table();
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  Forgotten stale;
  {
    std::lock_guard<std::shared_mutex> lock(t.mutex);
    const auto known = t.byBase.find(base);
    if (known != t.byBase.end()) {
      // NCCL memory a MemPool hands out, the same segment seen twice, or a
      // record that may be older than the one there.
      const Allocation& a = known->second;
      if (kind == MemoryKind::CachingAllocator &&
          (a.kind == MemoryKind::Nccl || a.size == size || !current)) {
        return;
      }
      // A stale record (its free went unseen): its registrations go first.
      stale = takeWhere(t, base, base + 1, [base](const Allocation& entry) {
        return entry.base == base;
      });
    }
    t.byBase[base] =
        Allocation{base, size, t.nextId++, device, kind, false, perTensor};
    countOf(t, kind).fetch_add(1, std::memory_order_release);
    t.count.store(t.byBase.size(), std::memory_order_release);
  }
  stale.tell();
}

void forgetAllocation(void* ptr) {
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  forgetWhere(base, base + 1, [base](const Allocation& a) {
    return a.base == base && a.kind == MemoryKind::Nccl;
  });
}

void forgetAllocations(const void* ptr, size_t size, MemoryKind kind) {
  const auto from = reinterpret_cast<uintptr_t>(ptr);
  forgetWhere(from, from + size, [kind](const Allocation& a) {
    return a.kind == kind;
  });
}

size_t allocationCount(MemoryKind kind) {
  return countOf(table(), kind).load(std::memory_order_acquire);
}

std::optional<Allocation> findAllocation(const void* ptr, size_t bytes) {
  Table& t = table();
  if (t.count.load(std::memory_order_acquire) == 0) {
    return std::nullopt;
  }
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  const Allocation* a = covering(t, address);
  if (a == nullptr || address + bytes > a->base + a->size) {
    return std::nullopt;
  }
  return *a;
}

void markDeviceWide(const void* ptr) {
  Table& t = table();
  std::lock_guard<std::shared_mutex> lock(t.mutex);
  if (Allocation* a = covering(t, reinterpret_cast<uintptr_t>(ptr))) {
    a->deviceWide = true;
  }
}

bool deviceWide(const void* ptr) {
  Table& t = table();
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  auto it = t.byBase.find(reinterpret_cast<uintptr_t>(ptr));
  return it != t.byBase.end() && it->second.deviceWide;
}

void noteWindowUse(const void* ptr, cudaStream_t stream) {
  Table& t = table();
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  const auto known = [&](uint64_t id) {
    const auto found = t.windowUsers.find(id);
    return found != t.windowUsers.end() &&
           std::find(found->second.begin(), found->second.end(), stream) !=
               found->second.end();
  };
  {
    std::shared_lock<std::shared_mutex> lock(t.mutex);
    const Allocation* a = covering(t, address);
    if (a == nullptr || known(a->id)) {
      return;
    }
  }
  std::lock_guard<std::shared_mutex> lock(t.mutex);
  if (const Allocation* a = covering(t, address); a && !known(a->id)) {
    t.windowUsers[a->id].push_back(stream);
  }
}

std::vector<cudaStream_t> windowUsers(const void* ptr) {
  Table& t = table();
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  const auto it = t.byBase.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == t.byBase.end()) {
    return {};
  }
  const auto users = t.windowUsers.find(it->second.id);
  return users != t.windowUsers.end() ? users->second
                                      : std::vector<cudaStream_t>{};
}

void addAllocationObserver(std::weak_ptr<AllocationObserver> observer) {
  Table& t = table();
  std::lock_guard<std::shared_mutex> lock(t.mutex);
  t.observers.push_back(std::move(observer));
}

} // namespace nccl_core

#include "backend/routing/comm_routes.h"

#include <c10/util/Logging.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "backend/routing/policy.h"

namespace nccl_core {

namespace {

// The flags of the live windows covering [ptr, ptr + bytes), or'd (NCCL
// takes its symmetric kernels if any of them is symmetric); -1 for none.
template <typename Windows>
int coveringWindowFlags(const Windows& windows, const void* ptr, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  int flags = -1;
  for (const auto& weak : windows) {
    const auto window = weak.lock();
    if (!window || !window->isValid()) {
      continue;
    }
    const auto base = reinterpret_cast<uintptr_t>(window->userPtr());
    if (address >= base && address + bytes <= base + window->size()) {
      flags = (flags < 0 ? 0 : flags) | window->flags();
    }
  }
  return flags;
}

bool valid(const std::shared_ptr<RegisteredBuffer>& buffer) {
  return buffer && buffer->isValid();
}

// What routing sizes an op by.
size_t largestTensorBytes(const RouteQuery& query) {
  size_t bytes = 0;
  for (const auto* tensors : {&query.outputs, &query.inputs}) {
    for (const at::Tensor& tensor : *tensors) {
      bytes = std::max(bytes, static_cast<size_t>(tensor.nbytes()));
    }
  }
  return bytes;
}

} // namespace

std::shared_ptr<CommRoutes> CommRoutes::attach(
    std::shared_ptr<Communicator> comm,
    AutoRegistration autoRegister,
    Engines engines) {
  std::shared_ptr<CommRoutes> routes(
      new CommRoutes(std::move(comm), autoRegister, std::move(engines)));
  routes->comm_->setListener(routes);
  addAllocationObserver(routes);
  return routes;
}

CommRoutes::CommRoutes(
    std::shared_ptr<Communicator> comm,
    AutoRegistration autoRegister,
    Engines engines)
    : comm_(std::move(comm)),
      autoRegister_(autoRegister),
      engines_(std::move(engines)),
      upgrade_(
          autoRegister.windowUpgrade ? std::make_unique<WindowUpgrade>(*comm_)
                                     : nullptr) {}

bool CommRoutes::hasStaging() const {
  return std::any_of(engines_.begin(), engines_.end(), [](const auto& engine) {
    return engine->hasStaging();
  });
}

CommRoutes::~CommRoutes() {
  if (hasStaging()) {
    // The peers map the staging through the communicator's window: it is
    // drained and unmapped before it is freed. The group's teardown aborts
    // first (with the watchdog stopped); this guards an owner that did not.
    // Told directly: this object can no longer be reached as the listener.
    // An abort already under way is waited for, and the drain repeated, as
    // that one could not tell this object.
    comm_->abort(*this);
    aborting();
    aborted();
  }
}

EngineRun CommRoutes::engineFor(const RouteQuery& query) {
  if (!query.engines || query.coalescing || engines_.empty()) {
    return nullptr;
  }
  const at::Tensor& output = query.outputs.at(0);
  const EngineCall call{
      query.type,
      output,
      query.inputs.empty() ? output : query.inputs.front(), // in place
      query.reduction,
      query.capturing};
  for (const auto& engine : engines_) {
    if (engine->suits(call)) {
      return [engine = engine.get(), call](cudaStream_t stream) {
        engine->enqueue(call, stream);
      };
    }
  }
  return nullptr;
}

Route CommRoutes::route(const RouteQuery& query) {
  if (EngineRun engine = engineFor(query)) {
    return Route{*comm_, std::move(engine)};
  }
  if (upgrade_ && query.agree && query.routable && !query.coalescing &&
      !query.capturing && symmetricKernelsSetting() == SymmetricKernels::Auto) {
    upgrade_->consider(
        query.type,
        largestTensorBytes(query),
        query.outputs,
        query.inputs,
        *query.agree);
  }
  // Most groups have no symmetric window, hence no twin: one atomic load.
  const bool mayMove = query.routable && !query.coalescing &&
                       hasTwin_.load(std::memory_order_acquire) &&
                       symmetricKernelsSetting() != SymmetricKernels::Always;
  const bool registers =
      (autoRegister_.ncclMemory || autoRegister_.cachingAllocator) &&
      registrationGains(query.type);
  // A group that leaves torch's segments alone has nothing to find without
  // NCCL memory (windows need it too), whatever other groups track.
  if ((!mayMove && !registers) || (!autoRegister_.cachingAllocator &&
                                   allocationCount(MemoryKind::Nccl) == 0)) {
    return Route{*comm_};
  }
  // One look per tensor: the allocation table (nothing to find without NCCL
  // memory or tracked segments), then this table, read-locked, for its
  // windows and registrations. Windows need NCCL memory, so plain tensors
  // stop early unless this group registers torch's segments.
  Found found;
  for (const auto* tensors : {&query.outputs, &query.inputs}) {
    for (const at::Tensor& tensor : *tensors) {
      const auto allocation =
          findAllocation(tensor.data_ptr(), tensor.nbytes());
      if (allocation && allocation->device == comm_->device() &&
          (allocation->kind == MemoryKind::Nccl ||
           autoRegister_.cachingAllocator)) {
        found.emplace_back(&tensor, *allocation);
      }
    }
  }
  if (found.empty()) {
    return Route{*comm_};
  }
  const Lookup known = lookUp(found);
  const bool toTwin =
      mayMove && known.twin && known.inSymmetricWindow &&
      !(symmetricKernelsSetting() == SymmetricKernels::Auto &&
        symmetricKernelsWin(query.type, largestTensorBytes(query)));
  // The twin, once made, is never replaced and lives as long as this object:
  // a reference will do.
  Route route{toTwin ? *known.twin : *comm_};
  if (registers) {
    for (const Touched& t : known.touched) {
      // NCCL finds memory in one of the communicator's windows by itself;
      // the twin has none.
      const bool registered =
          toTwin ? t.onTwin : t.onComm || t.windowFlags >= 0;
      const bool listed = std::any_of(
          route.toRegister.begin(), route.toRegister.end(), [&](const auto& a) {
            return a.id == t.allocation.id;
          });
      const bool wanted = t.allocation.kind == MemoryKind::Nccl
                              ? autoRegister_.ncclMemory
                              : autoRegister_.cachingAllocator;
      if (wanted && !registered && !listed && !t.unregistrable) {
        route.toRegister.push_back(t.allocation);
      }
    }
  }
  return route;
}

CommRoutes::Lookup CommRoutes::lookUp(const Found& found) const {
  Lookup known;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  known.twin = twin_;
  for (const auto& [tensor, allocation] : found) {
    Touched t{allocation};
    const auto memory = memory_.find(allocation.id);
    if (memory != memory_.end()) {
      t.windowFlags = coveringWindowFlags(
          memory->second.windows, tensor->data_ptr(), tensor->nbytes());
      t.onComm = valid(memory->second.onComm);
      t.onTwin = valid(memory->second.onTwin);
      t.unregistrable = memory->second.unregistrable;
    }
    known.inSymmetricWindow =
        known.inSymmetricWindow ||
        (t.windowFlags >= 0 && (t.windowFlags & NCCL_WIN_COLL_SYMMETRIC));
    known.touched.push_back(t);
  }
  return known;
}

void CommRoutes::registerMemory(Route& route) {
  const bool onTwin = &route.comm != comm_.get();
  const auto start = std::chrono::steady_clock::now();
  for (const Allocation& allocation : route.toRegister) {
    // The whole allocation, so every tensor carved from it (a MemPool
    // segment) shares one registration. Without the lock: other ops' routes
    // go on meanwhile.
    if (auto buffer = tryRegister(route.comm, allocation)) {
      keep(allocation.id, onTwin, std::move(buffer));
    }
  }
  firstUses_ += route.toRegister.size();
  firstUseNanos_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  route.toRegister.clear();
}

std::vector<std::shared_ptr<RegisteredBuffer>>
CommRoutes::registerSegments(const std::vector<Segment>& segments) {
  std::vector<std::shared_ptr<RegisteredBuffer>> buffers;
  for (const Segment& segment : segments) {
    void* base = reinterpret_cast<void*>(segment.address);
    // Tracked, so that its free drops the registration (a MemPool of NCCL
    // memory is in the table already).
    noteSegmentEvent(
        SegmentEvent::Existing, segment.address, segment.size, segment.device);
    const auto allocation = findAllocation(base, segment.size);
    if (!allocation) {
      continue; // freed meanwhile
    }
    {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      const auto known = memory_.find(allocation->id);
      if (known != memory_.end() && valid(known->second.onComm)) {
        buffers.push_back(known->second.onComm);
        continue;
      }
    }
    if (auto buffer = tryRegister(*comm_, *allocation)) {
      buffers.push_back(keep(allocation->id, /*onTwin=*/false, buffer));
    }
  }
  return buffers;
}

std::shared_ptr<RegisteredBuffer>
CommRoutes::tryRegister(Communicator& comm, const Allocation& allocation) {
  try {
    return comm.registerBuffer(
        reinterpret_cast<void*>(allocation.base), allocation.size);
  } catch (const c10::DistBackendError& e) {
    // NCCL may refuse torch's memory (ops then run unregistered), not its
    // own: a refusal there is an error.
    if (comm.isAborted() || allocation.kind == MemoryKind::Nccl) {
      throw;
    }
    LOG(WARNING) << "[nccl_core] " << comm.label() << " runs ops on "
                 << allocation.size << " bytes of torch's allocator at 0x"
                 << std::hex << allocation.base << std::dec
                 << " unregistered: NCCL refused to register them: "
                 << e.what_without_backtrace();
    std::unique_lock<std::shared_mutex> lock(mutex_);
    memory_[allocation.id].unregistrable = true;
    return nullptr;
  }
}

std::shared_ptr<RegisteredBuffer> CommRoutes::keep(
    uint64_t allocation,
    bool onTwin,
    std::shared_ptr<RegisteredBuffer> made) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  Memory& memory = memory_[allocation];
  std::shared_ptr<RegisteredBuffer>& slot =
      onTwin ? memory.onTwin : memory.onComm;
  if (!valid(slot)) {
    slot = std::move(made);
    return slot;
  }
  auto kept = slot;
  lock.unlock();
  made->close(); // another thread's op registered it meanwhile
  return kept;
}

RegistrationStats CommRoutes::registrationStats() const {
  RegistrationStats stats;
  stats.firstUses = firstUses_.load();
  stats.firstUseSeconds = static_cast<double>(firstUseNanos_.load()) * 1e-9;
  if (upgrade_) {
    stats.upgradedWindows = upgrade_->windows();
    stats.upgradedWindowBytes = upgrade_->windowBytes();
  }
  std::shared_lock<std::shared_mutex> lock(mutex_);
  for (const auto& [id, memory] : memory_) {
    for (const auto* buffer : {&memory.onComm, &memory.onTwin}) {
      if (valid(*buffer)) {
        ++stats.registrations;
        stats.bytes += (*buffer)->size();
      }
    }
  }
  return stats;
}

std::shared_ptr<Communicator> CommRoutes::twin() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return twin_;
}

void CommRoutes::setTimeout(std::chrono::milliseconds timeout) {
  // Under the lock the twin is published with: a twin made meanwhile takes
  // the new timeout either way.
  std::unique_lock<std::shared_mutex> lock(mutex_);
  comm_->setTimeout(timeout);
  if (twin_) {
    twin_->setTimeout(timeout);
  }
}

void CommRoutes::beforeWindow(Communicator& comm, int flags) {
  if ((flags & NCCL_WIN_COLL_SYMMETRIC) == 0) {
    return;
  }
  const std::lock_guard<std::mutex> splitting(twinMutex_);
  if (hasTwin_.load(std::memory_order_acquire)) {
    return;
  }
  // Collective like the window's registration, so every rank makes it here.
  ncclConfig_t config = comm.config(); // the group's settings (CTAs, ...)
  // Resources of its own: its abort then depends on nothing of the group's
  // communicator (see aborted()).
  config.splitShare = 0;
  auto twin =
      comm.split(0, comm.rank(), config, comm.label() + " (window-free twin)");
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (comm.isAborted()) {
    twin->abort(); // aborted meanwhile: the twin goes with it
  }
  twin->setTimeout(comm.timeout()); // a setTimeout since the split
  twin_ = std::move(twin);
  hasTwin_.store(true, std::memory_order_release);
}

void CommRoutes::windowRegistered(const std::shared_ptr<Window>& window) {
  if (const auto& allocation = window->allocation()) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto& windows = memory_[*allocation].windows;
    windows.erase(
        std::remove_if(
            windows.begin(),
            windows.end(),
            [](const std::weak_ptr<Window>& weak) {
              const auto live = weak.lock();
              return !live || !live->isValid();
            }),
        windows.end());
    windows.push_back(window);
  }
}

void CommRoutes::aborting() noexcept {
  for (const auto& engine : engines_) {
    engine->drain();
  }
  if (const auto twin = this->twin()) {
    twin->stopKernels(); // else its frees, after the group's, wait for them
  }
}

void CommRoutes::aborted() noexcept {
  if (const auto twin = this->twin()) {
    twin->abort();
  }
}

void CommRoutes::onFree(const Allocation& allocation) noexcept {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  // The communicators closed what covered it (their own observers).
  memory_.erase(allocation.id);
}

} // namespace nccl_core

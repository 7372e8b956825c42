#include "nccl/communicator.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <type_traits>

#include "nccl/api.h"
#include "nccl/dev_comm.h"
#include "nccl/errors.h"
#include "nccl/stream_ordered_free.h"
#include "nccl/version.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {
// For calls NCCL completes before returning (local ones, never
// ncclInProgress), made while holding the communicator's lock.
void checkLocal(const NcclApi& api, ncclResult_t result, const char* call) {
  if (C10_UNLIKELY(result != ncclSuccess)) {
    throwNcclError(result, call, __FILE__, __LINE__, api);
  }
}
} // namespace

std::shared_ptr<Communicator> Communicator::create(
    int nranks,
    int rank,
    const ncclUniqueId& id,
    Settings settings,
    const Started& started,
    Joining how) {
  const NcclApi& api = *settings.api;
  const bool grows = how == Joining::Grow;
  if (grows) {
    requireGrowSupport(api, "join");
  }
  const char* call = grows ? "ncclCommGrow" : "ncclCommInitRankConfig";
  DeviceGuard guard(api, settings.device);
  ncclComm_t comm = nullptr;
  ncclConfig_t& config = settings.config;
  const ncclResult_t result =
      grows ? api.commGrow(nullptr, nranks, &id, rank, &comm, &config)
            : api.commInitRankConfig(&comm, nranks, id, rank, &config);
  if (comm == nullptr) {
    throwNcclError(result, call, __FILE__, __LINE__, api);
  }
  // Owned from here on, so that a failed or late initialization is aborted.
  auto communicator = adopt(comm, rank, nranks, std::move(settings));
  if (started) {
    started(communicator);
  }
  if (grows) {
    communicator->settleGrow(result);
  } else {
    communicator->check(result, call);
  }
  return communicator;
}

ncclUniqueId Communicator::uniqueId(const NcclApi& api) {
  ncclUniqueId id;
  NCCL_CORE_CHECK(api, api.getUniqueId(&id));
  return id;
}

std::shared_ptr<Communicator> Communicator::split(
    int color,
    int key,
    ncclConfig_t config,
    std::string label) {
  const int ncclColor = color < 0 ? NCCL_SPLIT_NOCOLOR : color;
  auto make = [&](ncclComm_t parent, ncclComm_t* child) {
    return api_->commSplit(parent, ncclColor, key, child, &config);
  };
  return derive("ncclCommSplit", config, std::move(label), make);
}

std::shared_ptr<Communicator> Communicator::shrink(
    std::vector<int> excludedRanks,
    int flags,
    ncclConfig_t config,
    std::string label) {
  const auto excludedCount = static_cast<int>(excludedRanks.size());
  auto make = [&](ncclComm_t parent, ncclComm_t* child) {
    return api_->commShrink(
        parent, excludedRanks.data(), excludedCount, child, &config, flags);
  };
  return derive("ncclCommShrink", config, std::move(label), make);
}

std::shared_ptr<Communicator> Communicator::derive(
    const char* call,
    const ncclConfig_t& config,
    std::string label,
    c10::function_ref<ncclResult_t(ncclComm_t, ncclComm_t*)> make) {
  DeviceGuard guard(*api_, device_);
  ncclComm_t child = nullptr;
  {
    const HostCall inside(*this);
    const ncclResult_t result = make(inside.handle(), &child);
    if (result != ncclSuccess && result != ncclInProgress) {
      if (isAborted()) {
        raiseAborted(); // the abort ended the call
      }
      throwNcclError(result, call, __FILE__, __LINE__, *api_, comm_);
    }
  }
  if (nonblocking_) {
    // The parent's config decides: the call runs asynchronously and `child`
    // is only written once the parent has settled.
    const ncclResult_t state = settle(call);
    if (state != ncclSuccess) {
      throwNcclError(state, call, __FILE__, __LINE__, *api_, comm_);
    }
  }
  if (child == nullptr) {
    return nullptr;
  }
  int childRank = 0;
  int childSize = 0;
  NCCL_CORE_CHECK(*api_, api_->commUserRank(child, &childRank));
  NCCL_CORE_CHECK(*api_, api_->commCount(child, &childSize));
  auto adopted = adopt(
      child,
      childRank,
      childSize,
      {api_, device_, config, timeout(), std::move(label)});
  get(); // aborted meanwhile: the call fails, and the child goes with it
  return adopted;
}

Communicator::Communicator(
    ncclComm_t comm,
    int rank,
    int size,
    Settings settings)
    : api_(settings.api),
      comm_(comm),
      rank_(rank),
      size_(size),
      device_(settings.device),
      nonblocking_(settings.config.blocking == 0),
      timeout_(settings.timeout),
      label_(std::move(settings.label)),
      netName_(settings.config.netName ? settings.config.netName : ""),
      commName_(settings.config.commName ? settings.config.commName : ""),
      config_(settings.config) {
  config_.netName = config_.netName != nullptr ? netName_.c_str() : nullptr;
  config_.commName = config_.commName != nullptr ? commName_.c_str() : nullptr;
}

std::shared_ptr<Communicator>
Communicator::adopt(ncclComm_t comm, int rank, int size, Settings settings) {
  std::shared_ptr<Communicator> communicator(
      new Communicator(comm, rank, size, std::move(settings)));
  addAllocationObserver(communicator);
  return communicator;
}

Communicator::~Communicator() {
  abort();
}

ncclComm_t Communicator::get() const {
  if (C10_UNLIKELY(isAborted())) {
    raiseAborted();
  }
  return comm_;
}

void Communicator::raiseAborted() const {
  C10_THROW_ERROR(
      DistBackendError,
      c10::str("the NCCL communicator of ", label_, " was aborted"));
}

Communicator::Use::Use(Communicator& comm) : comm_(&comm) {
  comm.uses_.fetch_add(1);
  if (C10_UNLIKELY(comm.aborted_.load())) {
    Communicator* aborted = std::exchange(comm_, nullptr);
    if (aborted->uses_.fetch_sub(1) == 1 && aborted->releaseRequested_) {
      aborted->releaseHandle();
    }
    aborted->raiseAborted();
  }
}

Communicator::Use::~Use() {
  if (comm_ != nullptr && comm_->uses_.fetch_sub(1) == 1 &&
      comm_->releaseRequested_) {
    comm_->releaseHandle();
  }
}

void Communicator::check(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line) {
  if (C10_LIKELY(result == ncclSuccess)) {
    return;
  }
  if (result == ncclInProgress && nonblocking_) {
    result = settle(call);
    if (result == ncclSuccess) {
      return;
    }
  }
  if (isAborted()) {
    raiseAborted(); // the abort ended the call: that is what went wrong
  }
  throwNcclError(
      result, c10::str(call, " on ", label_).c_str(), file, line, *api_, comm_);
}

void Communicator::setTimeout(std::chrono::milliseconds timeout) {
  timeout_.store(timeout, std::memory_order_relaxed);
}

std::optional<ncclResult_t> Communicator::pollUntilSettled() {
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t result = ncclSuccess;
    {
      Use use(*this);
      std::lock_guard<std::mutex> lock(pollMutex_);
      result = api_->commGetAsyncError(use.handle(), &state);
    }
    if (result != ncclSuccess) {
      return result;
    }
    if (state != ncclInProgress) {
      return state;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return std::nullopt;
    }
    std::this_thread::yield();
  }
}

ncclResult_t Communicator::settle(const char* call) {
  if (const auto settled = pollUntilSettled()) {
    return *settled;
  }
  // Alive through the message below, should the abort drop the last other
  // reference (through its listener).
  const std::shared_ptr<Communicator> self = weak_from_this().lock();
  abort();
  C10_THROW_ERROR(
      DistBackendError,
      c10::str(
          call,
          " on the NCCL communicator of ",
          label_,
          " did not complete within ",
          timeout().count(),
          " ms; the communicator was aborted"));
}

void Communicator::abort() noexcept {
  abort(nullptr);
}

void Communicator::abort(CommunicatorListener& instead) noexcept {
  abort(&instead);
}

void Communicator::abort(CommunicatorListener* instead) noexcept {
  // ncclCommAbort rather than ncclCommDestroy: it frees the same resources
  // (registrations and windows included) but never waits for peers or for
  // operations that may never complete.
  // Released last, after the locks: it may hold the last reference to this
  // communicator's owner.
  std::shared_ptr<CommunicatorListener> listener;
  const std::lock_guard<std::mutex> aborting(abortMutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.exchange(true)) {
      return;
    }
    if (signalWindow_) {
      signalWindow_->abortWaits(); // before NCCL unmaps the peers' windows
    }
    listener = listener_.lock();
  }
  // Without the lock: what they end (copies into peers' memory, which must
  // finish before NCCL unmaps it) may need this communicator.
  if (instead) {
    instead->aborting();
  }
  if (listener && listener.get() != instead) {
    listener->aborting();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [_, resource] : resources_) {
      resource->closed_.store(true, std::memory_order_release);
    }
    resources_.clear();
    windows_.clear();
  }
  // A stay of its own, so that the handle outlives the revoke below; release
  // is requested only after it, so no stay ending meanwhile frees the handle.
  uses_.fetch_add(1);
  if (hostCalls_.load() > 0 && canRevoke()) {
    // A blocking collective host call (a window registration, a split) waits
    // in NCCL's bootstrap for peers that may never come, and only NCCL's
    // abort flag ends that wait: revoked, the communicator stays allocated
    // under the call; the last stay to end then aborts it.
    revokeHandle();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    releaseRequested_ = true;
    if (uses_.fetch_sub(1) == 1) {
      releaseHandle();
    }
  }
  if (instead) {
    instead->aborted();
  }
  if (listener && listener.get() != instead) {
    listener->aborted();
  }
}

bool Communicator::canRevoke() const {
  return !nonblocking_ && api_->commRevoke != nullptr &&
         capturedGraphs_.live() == 0 && !finalizing_.load();
}

bool Communicator::revokeHandle() noexcept {
  if (finalizing_.exchange(true)) {
    return false;
  }
  try {
    DeviceGuard guard(*api_, device_);
    NCCL_CORE_WARN(*api_, api_->commRevoke(comm_, 0));
  } catch (const std::exception& e) {
    LOG(WARNING) << "[nccl_core] could not revoke the NCCL communicator of "
                 << label_ << ": " << e.what();
  }
  return true;
}

bool Communicator::stopKernels() noexcept {
  if (!canRevoke()) {
    return false;
  }
  try {
    const Use use(*this); // raises once aborted: nothing is left to stop
    return revokeHandle();
  } catch (const std::exception&) {
    return false;
  }
}

bool Communicator::finalizable() const noexcept {
  // NCCL's finalize also waits for the CUDA graphs that captured its work. A
  // suspended communicator has no op in flight, and no memory to finalize.
  return capturedGraphs_.live() == 0 && !isSuspended() && !isAborted() &&
         !finalizing_.load();
}

bool Communicator::flush() noexcept {
  if (!finalizable()) {
    return false;
  }
  if (!nonblocking_) {
    return finalizeBlocking();
  }
  try {
    const Use use(*this); // raises once aborted: nothing is left to flush
    if (finalizing_.exchange(true)) {
      return false;
    }
    DeviceGuard guard(*api_, device_);
    const ncclResult_t started = api_->commFinalize(use.handle());
    if (started != ncclInProgress) {
      return started == ncclSuccess;
    }
    const auto settled = pollUntilSettled();
    return settled && *settled == ncclSuccess;
  } catch (const std::exception& e) {
    LOG(WARNING) << "[nccl_core] could not flush the NCCL communicator of "
                 << label_ << ": " << e.what();
    return false;
  }
}

bool Communicator::finalizeBlocking() noexcept {
  struct Outcome {
    std::mutex mutex;
    std::condition_variable ended;
    std::optional<bool> flushed;
  };
  const auto outcome = std::make_shared<Outcome>();
  try {
    // The thread's Use keeps the handle until finalize returns: an abort
    // meanwhile frees it then, on that thread.
    std::thread([self = shared_from_this(), outcome]() mutable {
      // Its stream syncs, and the abort it may end with, must not break
      // another thread's CUDA graph capture.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
      C10_CUDA_CHECK_WARN(self->api_->exchangeStreamCaptureMode(&mode));
      bool flushed = false;
      try {
        const Use use(*self); // raises once aborted
        if (!self->finalizing_.exchange(true)) {
          DeviceGuard guard(*self->api_, self->device_);
          flushed = self->api_->commFinalize(use.handle()) == ncclSuccess;
        }
      } catch (const std::exception&) {
        // aborted before it started: nothing is left to flush
      }
      // Dropped before the caller hears back, so that a flush that returns
      // in time leaves the communicator's end to its owners' threads.
      self.reset();
      {
        std::lock_guard<std::mutex> lock(outcome->mutex);
        outcome->flushed = flushed;
      }
      outcome->ended.notify_all();
    }).detach();
  } catch (const std::exception& e) {
    LOG(WARNING) << "[nccl_core] could not flush the NCCL communicator of "
                 << label_ << ": " << e.what();
    return false;
  }
  std::unique_lock<std::mutex> lock(outcome->mutex);
  if (outcome->ended.wait_for(
          lock, timeout(), [&] { return outcome->flushed.has_value(); })) {
    return *outcome->flushed;
  }
  LOG(WARNING) << "[nccl_core] ncclCommFinalize on the NCCL communicator of "
               << label_ << " did not return within " << timeout().count()
               << " ms; the communicator is freed once it does";
  return false;
}

void Communicator::releaseHandle() noexcept {
  if (released_.exchange(true)) {
    return;
  }
  if (capturedGraphs_.live() > 0) {
    // ncclCommAbort ends the communicator's kernels at once, then waits for
    // the graphs; teardown must not wait with it.
    LOG(WARNING) << "[nccl_core] " << capturedGraphs_.live()
                 << " CUDA graph(s) that captured work of this communicator "
                    "are alive: NCCL frees it once they are destroyed";
    try {
      std::thread([api = api_, comm = comm_, device = device_] {
        // Woken when a graph dies, perhaps beside another thread's capture.
        cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
        C10_CUDA_CHECK_WARN(api->exchangeStreamCaptureMode(&mode));
        C10_CUDA_CHECK_WARN(api->setDevice(device));
        NCCL_CORE_WARN(*api, api->commAbort(comm));
      }).detach();
    } catch (const std::exception& e) {
      LOG(ERROR) << "[nccl_core] no thread to abort the communicator on ("
                 << e.what() << "); it is left to the process's exit";
    }
    return;
  }
  try {
    DeviceGuard guard(*api_, device_);
    NCCL_CORE_WARN(*api_, api_->commAbort(comm_));
  } catch (const std::exception& e) {
    LOG(ERROR) << "[nccl_core] could not abort the NCCL communicator of "
               << label_ << ": " << e.what();
  }
}

std::string Communicator::lastError() {
  try {
    Use use(*this);
    const char* text = api_->getLastError(use.handle());
    return text != nullptr ? text : "";
  } catch (const c10::DistBackendError&) {
    return ""; // aborted: the abort reports itself
  }
}

ncclResult_t Communicator::asyncError() {
  if (isAborted()) {
    return ncclSuccess;
  }
  try {
    Use use(*this);
    std::lock_guard<std::mutex> lock(pollMutex_);
    ncclResult_t asyncResult = ncclSuccess;
    const ncclResult_t result =
        api_->commGetAsyncError(use.handle(), &asyncResult);
    return result != ncclSuccess ? result : asyncResult;
  } catch (const c10::DistBackendError&) {
    return ncclSuccess; // aborted meanwhile: the abort reports itself
  }
}

template <typename Resource, typename... Args>
std::shared_ptr<Resource> Communicator::track(Args&&... args) {
  auto resource =
      std::make_shared<Resource>(weak_from_this(), std::forward<Args>(args)...);
  resources_.emplace(resource.get(), resource);
  if constexpr (std::is_same_v<Resource, Window>) {
    windows_.push_back(resource.get());
  }
  return resource;
}

std::shared_ptr<RegisteredBuffer>
Communicator::registerBuffer(void* ptr, size_t bytes) {
  refuseWhileSuspended();
  const auto allocation = findAllocation(ptr, bytes);
  DeviceGuard guard(*api_, device_);
  std::lock_guard<std::mutex> lock(mutex_);
  void* handle = nullptr;
  checkLocal(
      *api_,
      api_->commRegister(get(), ptr, bytes, &handle),
      "ncclCommRegister");
  return track<RegisteredBuffer>(
      allocation ? std::optional<uint64_t>(allocation->id) : std::nullopt,
      handle,
      bytes);
}

std::shared_ptr<Window> Communicator::registerWindow(
    void* ptr,
    size_t bytes,
    int flags,
    WindowLayout layout) {
  TORCH_INTERNAL_ASSERT(static_cast<int>(layout.size()) == size_);
  if (const auto conflict =
          layoutConflict(layout, hasFeature(Feature::WindowSizesPerRank))) {
    // Every rank holds the same layout: each raises here, before NCCL.
    NCCL_CORE_CHECK_ARG(false, "register_window", *conflict);
  }
  const auto allocation = findAllocation(ptr, bytes);
  DeviceGuard guard(*api_, device_);
  std::shared_ptr<CommunicatorListener> listener;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    listener = listener_.lock();
  }
  // Collective: waits for the peers, so without the lock (abort must stay
  // possible meanwhile).
  if (listener) {
    listener->beforeWindow(*this, flags);
  }
  const ncclWindow_t window = windowRegister(ptr, bytes, flags);
  std::shared_ptr<Window> tracked;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    get(); // raises if aborted meanwhile
    if (window == nullptr) {
      return nullptr; // no windows on this platform
    }
    tracked = track<Window>(
        allocation ? std::optional<uint64_t>(allocation->id) : std::nullopt,
        window,
        ptr,
        bytes,
        flags,
        std::move(layout));
  }
  if (listener) {
    listener->windowRegistered(tracked);
  }
  if (oneSidedEngine() == OneSidedEngine::LoadStore) {
    prepareLoadStore(*tracked);
  }
  return tracked;
}

std::shared_ptr<CustomRedOp>
Communicator::createPreMulSum(const void* hostScalar, ncclDataType_t dtype) {
  DeviceGuard guard(*api_, device_);
  std::lock_guard<std::mutex> lock(mutex_);
  ncclRedOp_t op;
  checkLocal(
      *api_,
      api_->redOpCreatePreMulSum(
          &op,
          const_cast<void*>(hostScalar),
          dtype,
          ncclScalarHostImmediate,
          get()),
      "ncclRedOpCreatePreMulSum");
  return track<CustomRedOp>(op, dtype);
}

void Communicator::prepareLoadStore(const Window& window) {
  if (!windowAddressesReadable(*api_)) {
    // The same on every rank: windows work, one-sided operations will say
    // what they need.
    return;
  }
  signals();
  window.lsaBases(
      [&] { return lsaBases(*this, window.get(), lsaTeam(*this).size); });
}

SignalWindow* Communicator::signalWindow() {
  std::lock_guard<std::mutex> lock(mutex_);
  return signalWindow_.get();
}

SignalWindow& Communicator::signals() {
  if (SignalWindow* made = signalWindow()) {
    return *made;
  }
  // Collective, so made without the lock (abort must stay possible).
  auto made = std::make_unique<SignalWindow>(*this);
  std::lock_guard<std::mutex> lock(mutex_);
  get(); // aborted meanwhile: its window is gone
  signalWindow_ = std::move(made);
  return *signalWindow_;
}

ncclWindow_t Communicator::windowRegister(void* ptr, size_t bytes, int flags) {
  // Windows this thread freed go first, their streams waited for: NCCL
  // places each window of a communicator in a space of its own by first fit
  // and binds multicast (NVLS) memory at that place, which must be the same
  // on every rank, so every rank's windows must come and go in the same
  // order. A free is in program order; a deferred release would not be.
  freeFinished(/*wait=*/true);
  DeviceGuard guard(*api_, device_);
  ncclWindow_t window = nullptr;
  ncclResult_t result = ncclSuccess;
  {
    const HostCall inside(*this);
    result =
        api_->commWindowRegister(inside.handle(), ptr, bytes, &window, flags);
  }
  check(result, "ncclCommWindowRegister");
  if (nonblocking_) {
    // Returns before the peers joined; `window` is written once settled.
    check(ncclInProgress, "ncclCommWindowRegister");
  }
  return window;
}

ncclWindow_t Communicator::registerInternalWindow(void* ptr, size_t bytes) {
  const ncclWindow_t window = windowRegister(ptr, bytes, NCCL_WIN_DEFAULT);
  NCCL_CORE_CHECK_SUPPORTED(
      window != nullptr,
      "register_window",
      "NCCL has no windows on this platform");
  markDeviceWide(ptr); // the package's kernels use it from any stream
  return window;
}

std::shared_ptr<DevComm>
Communicator::adoptDevComm(std::shared_ptr<void> devComm) {
  std::lock_guard<std::mutex> lock(mutex_);
  get(); // aborted meanwhile: NCCL freed it
  return track<DevComm>(std::move(devComm));
}

void Communicator::destroyRedOp(ncclRedOp_t op) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!isAborted()) {
    DeviceGuard guard(*api_, device_);
    NCCL_CORE_WARN(*api_, api_->redOpDestroy(op, comm_));
  }
}

Window*
Communicator::windowCovering(const void* ptr, size_t bytes, int flags) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  for (Window* window : windows_) {
    const auto base = reinterpret_cast<uintptr_t>(window->userPtr());
    if ((window->flags() & flags) == flags && address >= base &&
        address + bytes <= base + window->size()) {
      return window;
    }
  }
  return nullptr;
}

std::shared_ptr<Window>
Communicator::findWindow(const void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Window* window = windowCovering(ptr, bytes, 0);
  return window != nullptr
             ? std::static_pointer_cast<Window>(resources_.at(window))
             : nullptr;
}

bool Communicator::overlapsWindow(const void* ptr, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(windows_.begin(), windows_.end(), [&](Window* window) {
    const auto base = reinterpret_cast<uintptr_t>(window->userPtr());
    return address < base + window->size() && base < address + bytes;
  });
}

size_t Communicator::resourceCount() {
  std::lock_guard<std::mutex> lock(mutex_);
  return resources_.size();
}

bool Communicator::inSymmetricWindow(const void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return windowCovering(ptr, bytes, NCCL_WIN_COLL_SYMMETRIC) != nullptr;
}

void Communicator::setListener(std::weak_ptr<CommunicatorListener> listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  listener_ = std::move(listener);
}

void Communicator::close(CommResource& resource) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (resource.closed_.exchange(true, std::memory_order_acq_rel)) {
    return;
  }
  auto it = resources_.find(&resource);
  if (it == resources_.end()) {
    return;
  }
  // Keeps the resource alive until released, whoever else lets go of it.
  std::shared_ptr<CommResource> owned = std::move(it->second);
  resources_.erase(it);
  windows_.erase(
      std::remove(windows_.begin(), windows_.end(), owned.get()),
      windows_.end());
  if (!isAborted()) {
    DeviceGuard guard(*api_, device_);
    owned->release(*api_, comm_);
    if (nonblocking_) {
      // A release may be collective (window deregistration) and return
      // ncclInProgress: NCCL refuses the next call until it settled.
      try {
        const auto settled = pollUntilSettled();
        if (!settled || *settled != ncclSuccess) {
          LOG(WARNING) << "[nccl_core] releasing a resource of " << label_
                       << (settled ? " failed: " : " did not complete in time")
                       << (settled ? resultName(*settled) : "");
        }
      } catch (const std::exception& e) {
        LOG(WARNING) << "[nccl_core] releasing a resource of " << label_ << ": "
                     << e.what();
      }
    }
  }
}

void Communicator::onFree(const Allocation& allocation) noexcept {
  std::vector<std::shared_ptr<CommResource>> covering;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [_, resource] : resources_) {
      if (resource->allocation() == allocation.id) {
        covering.push_back(resource);
      }
    }
  }
  for (const auto& resource : covering) {
    close(*resource);
  }
}

} // namespace nccl_core

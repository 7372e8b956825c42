// NcclCoreBackend lifecycle: communicator creation, abort and shutdown. Groups
// made from a group live in child_groups.cpp, the ops in collectives.cpp and
// point_to_point.cpp.
#include "backend/backend.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Logging.h>
#include <c10/util/env.h>

#include <limits>
#include <numeric>
#include <thread>

#include "backend/ops/arguments.h"
#include "backend/ops/nan_check.h"
#include "backend/runtime/flight_recorder.h"
#include "backend/runtime/meetings.h"
#include "nccl/api.h"
#include "nccl/caching_allocator_segments.h"
#include "nccl/errors.h"
#include "nccl/version.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {
// Shutdown waits this long past the timeout for the watchdog to fail a stuck
// op before it gives up on its own.
constexpr auto kShutdownSlack = std::chrono::seconds(5);

std::vector<int64_t> allRanks(int size) {
  std::vector<int64_t> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

// Why a group failed as it was set up: its `what` could not be made.
std::string
notMade(const char* what, const std::string& group, const std::exception& e) {
  return c10::str(
      "the ", what, " of group '", group, "' could not be made: ", e.what());
}

} // namespace

NcclCoreBackend::NcclCoreBackend(
    Membership member,
    std::shared_ptr<const NcclCoreOptions> options,
    std::chrono::milliseconds defaultTimeout,
    std::shared_ptr<Communicator> comm,
    std::vector<int64_t> globalRanks)
    : c10d::Backend(member.rank, member.size),
      groupName_(std::make_shared<const std::string>(std::move(member.name))),
      options_(std::move(options)),
      timeout_(options_->timeout.value_or(defaultTimeout)),
      // torch names no ranks for the default group: its own.
      globalRanks_(
          globalRanks.empty() ? allRanks(member.size) : std::move(globalRanks)),
      globalRank_(static_cast<int>(globalRanks_[member.rank])),
      traceGroup_(
          FlightRecorder::process().addGroup(*groupName_, globalRanks_)),
      agreement_(
          std::move(member.store),
          member.rank,
          member.size,
          *groupName_,
          timeout_,
          failure_),
      autoRegister_(
          c10::utils::check_env("TORCH_NCCL_CORE_AUTO_REGISTER")
              .value_or(true)),
      registersSegments_(
          options_->registersCachingAllocator() &&
          trackCachingAllocatorSegments()),
      runner_(
          RunnerGroup{
              *this,
              groupName_,
              traceGroup_,
              failure_,
              ephemeral_,
              timeout_,
              suspendState_,
              &agreeOnUpgrade_,
              [this] { return deviceForOpWithoutTensors({}); }},
          nanCheckRequested(),
          c10::utils::check_env("TORCH_NCCL_ENABLE_TIMING").value_or(false)) {
  options_->validate();
  options_->allReduceKernelsSetting(); // its environment variable too
  if (FlightRecorder::process().enabled()) {
    // First of the abort hooks: the dump shows the group as it failed.
    hooks_->abort.add(
        std::numeric_limits<int64_t>::min(), [rank = globalRank_] {
          FlightRecorder::process().dumpOnFailure(rank);
        });
  }
  if (comm) {
    setupCommunicator(std::move(comm));
  }
}

NcclCoreBackend::~NcclCoreBackend() {
  // First: one-sided ops on the communicator, which may outlive this
  // backend, stop reaching it (after the ones running now).
  oneSidedLink_.reset();
  try {
    shutdown();
  } catch (const std::exception& e) {
    LOG(WARNING) << "[nccl_core] shutdown of group '" << *groupName_
                 << "' failed: " << e.what();
  }
}

Communicator& NcclCoreBackend::communicator(at::Device device) {
  failure_->raiseIfFailed();
  if (C10_UNLIKELY(!commReady_.load(std::memory_order_acquire))) {
    // First use, perhaps on several threads at once: one makes the
    // communicator (collectively), the others wait for it, as
    // ProcessGroupNCCL's getNCCLComm does under its mutex.
    const std::lock_guard<std::mutex> lock(firstUseMutex_);
    if (!comm_) {
      failure_->raiseIfFailed(); // the first use that failed failed the group
      initCommunicator(device);
    }
  }
  return *comm_;
}

std::shared_ptr<Communicator>
NcclCoreBackend::sharedCommunicator(std::optional<at::Device> device) {
  communicator(device ? *device : deviceForOpWithoutTensors({}));
  return comm_;
}

std::shared_ptr<Communicator> NcclCoreBackend::windowFreeTwin() {
  std::lock_guard<std::mutex> lock(timeoutMutex_); // routes_ is set under it
  return routes_ ? routes_->twin() : nullptr;
}

Communicator& NcclCoreBackend::communicatorFor(
    const at::Tensor& tensor,
    const char* op,
    const char* what) {
  checkCuda(tensor, op, what);
  Communicator& comm = communicator(tensor.device());
  checkTensor(tensor, deviceOf(comm), op, what);
  return comm;
}

void NcclCoreBackend::initCommunicator(at::Device device) {
  NCCL_CORE_CHECK_ARG(
      device.is_cuda() && device.has_index(),
      "init",
      "the communicator needs a CUDA device with an index, got ",
      device);
  std::shared_ptr<Communicator> comm;
  try {
    comm = newCommunicator(
        "init",
        getRank(),
        getSize(),
        device.index(),
        *groupName_,
        [this] { return failure_->failed(); }, // abort() during the meeting
        [this](const std::shared_ptr<Communicator>& started) {
          {
            std::lock_guard<std::mutex> lock(initMutex_);
            initializing_ = started;
          }
          if (failure_->failed()) {
            started->abort(); // aborted before it could be seen
          }
        });
  } catch (const std::exception& e) {
    // The meeting and NCCL's unique id are spent: a second try under them
    // could join stale keys. The group fails; a new one meets afresh.
    failure_->set(notMade("NCCL communicator", *groupName_, e));
    throw;
  }
  setupCommunicator(std::move(comm));
}

std::shared_ptr<Communicator> NcclCoreBackend::newCommunicator(
    const std::string& purpose,
    int rank,
    int size,
    int device,
    const std::string& name,
    const std::function<bool()>& abandon,
    const std::function<void(const std::shared_ptr<Communicator>&)>& started) {
  const std::string label = c10::str("group '", name, "'");
  // Once the meeting went ahead every rank enters NCCL's initialization, an
  // aborted one too: `started` then aborts it, and the others finish theirs.
  const NcclApi& api = *options_->api;
  const ncclUniqueId id =
      agreement_.rendezvous(purpose, label, rank, size, abandon, [&api] {
        return Communicator::uniqueId(api);
      });
  auto comm = Communicator::create(
      size,
      rank,
      id,
      {&api, device, options_->toNcclConfig(), timeout_.load(), label},
      started);
  if (rank == 0) {
    // Every rank read the id: the initialization it joined was collective.
    agreement_.leaveRendezvous(purpose, size);
  }
  return comm;
}

void NcclCoreBackend::setupCommunicator(std::shared_ptr<Communicator> comm) {
  const auto device = static_cast<c10::DeviceIndex>(comm->device());
  comm_ = std::move(comm);
  auto events = std::make_shared<EventPool>(comm_->device());
  // NCCL runs symmetric kernels only where every peer is load/store
  // reachable: elsewhere windows would gain nothing. Asked before the locks
  // (it asks NCCL).
  const bool upgradesWindows =
      options_->upgradesWindows() && comm_->size() > 1 &&
      hasFeature(Feature::WindowRegistration) && everyPeerLoadStore(*comm_);
  // Collective (engines make their staging with the communicator): before
  // the locks too. A failure there fails the group, its communicator aborted
  // first (peers may map what was made), so that no op finds it half set up.
  Engines engines;
  try {
    engines = makeEngines(*comm_, *events, *options_);
  } catch (const std::exception& e) {
    failure_->set(notMade("engines", *groupName_, e));
    comm_->abort();
    throw;
  }
  std::lock_guard<std::mutex> lock(initMutex_);
  // Read under the lock that setTimeout takes: neither misses a new timeout.
  std::lock_guard<std::mutex> timeoutLock(timeoutMutex_);
  routes_ = CommRoutes::attach(
      comm_,
      AutoRegistration{autoRegister_, registersSegments_, upgradesWindows},
      std::move(engines));
  routes_->setTimeout(timeout_.load());
  watchdog_ = std::make_unique<Watchdog>(
      WatchedGroup{
          comm_,
          failure_,
          agreement_.store(),
          *groupName_,
          agreement_.key("abort"),
          events,
          hooks_,
          ephemeral_,
          traceGroup_},
      timeout_.load());
  runner_.attach(
      RunnerParts{
          comm_,
          routes_,
          watchdog_.get(),
          std::move(events),
          c10::cuda::getStreamFromPool(options_->highPriorityStream, device)});
  oneSidedLink_ = std::make_unique<OneSidedLink>(*comm_, *this);
  commReady_.store(true, std::memory_order_release);
}

void NcclCoreBackend::refuseInsideCoalescing(const char* op) {
  const EndCoalescingOnError endOnError(runner_);
  NCCL_CORE_CHECK_STATE(
      !runner_.coalescing(),
      op,
      "one-sided operations cannot run inside a coalescing block "
      "(batch_isend_irecv, _coalescing_manager); issue them after it");
}

void NcclCoreBackend::runOneSided(
    const char* name,
    c10::ArrayRef<int> peers,
    bool waits,
    cudaStream_t stream,
    c10::function_ref<void()> enqueue) {
  refuseInsideCoalescing(name);
  SyncOpDetail detail;
  for (int peer : peers) {
    detail.addPeer(peer);
  }
  detail.waitsOnPeers = waits;
  LaunchOptions options;
  options.oneSided = &detail;
  options.sendsData = false; // its tensors are the caller's to check
  const at::Device device(
      at::kCUDA, static_cast<c10::DeviceIndex>(comm_->device()));
  // A synchronous op runs on the current stream: make it the caller's. c10
  // names the legacy default stream by id, not by its handles.
  const c10::cuda::CUDAStreamGuard onStream(
      stream == nullptr || stream == cudaStreamLegacy
          ? c10::cuda::getDefaultCUDAStream(device.index())
          : c10::cuda::getStreamFromExternal(stream, device.index()));
  runner_.launch(
      OpCall{c10d::OpType::UNKNOWN, name, device, false, c10d::kUnsetTimeout},
      {},
      {},
      [&](const NcclTarget&) {
        enqueue();
        return ncclSuccess;
      },
      options);
}

at::Device NcclCoreBackend::deviceForOpWithoutTensors(
    const std::vector<int64_t>& deviceIds) {
  if (!deviceIds.empty()) {
    return at::Device(
        at::kCUDA, static_cast<c10::DeviceIndex>(deviceIds.front()));
  }
  if (commReady_.load(std::memory_order_acquire)) {
    return at::Device(
        at::kCUDA, static_cast<c10::DeviceIndex>(comm_->device()));
  }
  if (auto bound = getBoundDeviceId()) {
    return *bound;
  }
  // Not the current device: processes that never call set_device would all
  // pick cuda:0. torch's NCCL backend guesses the same way.
  const c10::DeviceIndex count = c10::cuda::device_count();
  NCCL_CORE_CHECK_STATE(
      count > 0,
      "init",
      "group '",
      *groupName_,
      "' needs a CUDA device, and this process sees none");
  const auto device = static_cast<c10::DeviceIndex>(globalRank_ % count);
  TORCH_WARN_ONCE(
      "nccl_core: group '",
      *groupName_,
      "' runs an op without tensors before it knows its device; using cuda:",
      static_cast<int>(device),
      " (global rank % device count). Pass device_id= to init_process_group "
      "or call torch.cuda.set_device to choose.");
  return at::Device(at::kCUDA, device);
}

void NcclCoreBackend::eagerConnectSingleDevice(at::Device device) {
  communicator(device);
}

c10::intrusive_ptr<c10d::Backend::Options>
NcclCoreBackend::getBackendOptions() {
  return c10::make_intrusive<GroupOptions>(timeout_.load(), *groupName_);
}

#ifdef C10D_BACKEND_HAS_HOOKS
void NcclCoreBackend::registerAbortHook(int64_t id, c10d::AbortHook hook) {
  hooks_->abort.add(id, std::move(hook));
}

void NcclCoreBackend::unregisterAbortHook(int64_t id) {
  hooks_->abort.remove(id);
}
#endif

#if NCCL_CORE_HAS_COMPLETION_HOOKS
void NcclCoreBackend::registerCompletionHook(
    int64_t id,
    c10d::CompletionHook hook) {
  hooks_->completion.add(id, std::move(hook));
}

void NcclCoreBackend::unregisterCompletionHook(int64_t id) {
  hooks_->completion.remove(id);
}
#endif

void NcclCoreBackend::setTimeout(std::chrono::milliseconds timeout) {
  NCCL_CORE_CHECK_ARG(
      timeout.count() > 0,
      "set_timeout",
      "the timeout of group '",
      *groupName_,
      "' must be positive, got ",
      timeout.count(),
      " ms");
  // Not initMutex_: a teardown holds it while it joins the watchdog, which
  // may be running a Python hook that waits for this caller's GIL.
  std::lock_guard<std::mutex> lock(timeoutMutex_);
  timeout_.store(timeout);
  if (watchdog_) {
    watchdog_->setTimeout(timeout);
    routes_->setTimeout(timeout);
  }
}

c10d::ErrorType NcclCoreBackend::getError() {
  return failure_->failed() ? c10d::ErrorType::COMM_ERROR
                            : c10d::ErrorType::SUCCESS;
}

void NcclCoreBackend::teardown(const std::string& reason) {
  std::lock_guard<std::mutex> lock(initMutex_);
  if (watchdog_) {
    // Stopped first: a poll racing the abort would touch a freed
    // communicator.
    watchdog_->stop();
    watchdog_->fail(reason, /*tellPeers=*/false);
    watchdog_->reapRetired();
  } else {
    failure_->set(reason);
    if (auto comm = initializing_.lock()) {
      comm->abort(); // its initialization raises DistBackendError
    }
  }
}

void NcclCoreBackend::teardownWithoutFinalizing(const std::string& reason) {
  teardown(reason);
  // Without a communicator no peer can be finalizing one with this rank; a
  // meeting this rank came to or gave up is settled already.
  if (!comm_ || !hasFeature(Feature::FinalizeWaitsForHost) ||
      finalizeSettled_.exchange(true)) {
    return;
  }
  try {
    agreement_.giveUp("finalize");
  } catch (const std::exception& e) {
    LOG(WARNING) << "[nccl_core] group '" << *groupName_
                 << "' could not tell its peers that it will not finalize ("
                 << e.what() << "); they wait up to the group's timeout";
  }
}

bool NcclCoreBackend::finalizeMeeting() noexcept {
  if (!hasFeature(Feature::FinalizeWaitsForHost)) {
    return true;
  }
  finalizeSettled_.store(true);
  try {
    {
      // The group is idle: no failure may now abort a communicator that its
      // peers finalize. A peer that fails meanwhile gives the meeting up.
      const std::lock_guard<std::mutex> lock(initMutex_);
      watchdog_->stop();
    }
    // Each rank's vote: 0 where it cannot finalize (a CUDA graph that
    // captured the group's work alive), 1 without a twin, size + 1 with one
    // (a twin that one rank lacks would leave the others in its barrier).
    const auto twin = routes_->twin();
    const int64_t size = getSize();
    const bool finalizable = !failure_->failed() && comm_->finalizable() &&
                             (!twin || twin->finalizable());
    const int64_t vote = twoWayVote(finalizable, twin != nullptr, size);
    if (!unanimous(agreement_.meetEveryRank("finalize", vote), vote, size)) {
      LOG(INFO) << "[nccl_core] group '" << *groupName_
                << "' is aborted, not finalized: not every rank can finalize "
                   "it (a CUDA graph that captured its work alive)";
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    LOG(INFO) << "[nccl_core] group '" << *groupName_
              << "' is aborted, not finalized: " << e.what();
    return false;
  }
}

void NcclCoreBackend::abort() {
  teardownWithoutFinalizing(
      c10::str("nccl_core group '", *groupName_, "' was aborted"));
}

bool NcclCoreBackend::idleOrBroken() noexcept {
  try {
    return watchdog_->idle();
  } catch (const std::exception& e) {
    LOG(ERROR) << "[nccl_core] group '" << *groupName_
               << "' cannot tell whether its ops finished: " << e.what();
    return true;
  }
}

void NcclCoreBackend::shutdown() {
  const std::chrono::milliseconds timeout =
      timeout_.load() + ephemeral_->active();
  bool finalized = false;
  if (watchdog_ && !failure_->failed()) {
    // Every enqueued op, synchronous ones on the caller's streams included,
    // finishes before NCCL goes: aborting under an op a peer is about to
    // join would end it early and leave wrong results. The watchdog fails a
    // stuck op at its timeout, so this wait is bounded.
    const auto deadline =
        std::chrono::steady_clock::now() + timeout + kShutdownSlack;
    bool idle = true;
    while (!failure_->failed() && !(idle = idleOrBroken())) {
      if (std::chrono::steady_clock::now() > deadline) {
        LOG(ERROR) << "[nccl_core] group '" << *groupName_
                   << "' still has unfinished ops " << timeout.count()
                   << " ms (its timeout) plus "
                   << std::chrono::seconds(kShutdownSlack).count()
                   << " s into shutdown; aborting it";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (idle && !failure_->failed() && finalizeMeeting()) {
      // Over a network the data of an op that finished here may still be on
      // its way to a peer: it arrives before NCCL goes.
      comm_->flush();
      if (const auto twin = routes_->twin()) {
        twin->flush();
      }
      finalized = true;
    }
  }
  const std::string reason =
      c10::str("nccl_core group '", *groupName_, "' was shut down");
  if (finalized) {
    teardown(reason);
  } else {
    teardownWithoutFinalizing(reason);
  }
}

} // namespace nccl_core

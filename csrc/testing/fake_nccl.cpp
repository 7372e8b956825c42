#include "testing/fake_nccl.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>

namespace nccl_core {

namespace {

std::atomic<FakeNccl*> installedFake{nullptr};
thread_local int currentDevice = 0;

FakeNccl::Comm* fakeOf(ncclComm_t comm) {
  return reinterpret_cast<FakeNccl::Comm*>(comm);
}

ncclComm_t handleOf(FakeNccl::Comm* comm) {
  return reinterpret_cast<ncclComm_t>(comm);
}

// A call on `comm`: entered, then left on every path.
struct Call {
  Call(const char* name, FakeNccl::Comm* comm)
      : name(name), comm(comm), result(FakeNccl::current().enter(name, comm)) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call() {
    FakeNccl::current().leave(name, comm);
  }
  const char* name;
  FakeNccl::Comm* comm;
  ncclResult_t result;
};

ncclResult_t initRankConfig(
    ncclComm_t* comm,
    int nranks,
    ncclUniqueId /*id*/,
    int rank,
    ncclConfig_t* config) {
  FakeNccl::Comm* made = FakeNccl::current().make(rank, nranks, config, true);
  *comm = handleOf(made);
  return Call("ncclCommInitRankConfig", made).result;
}

ncclResult_t splitComm(
    ncclComm_t comm,
    int color,
    int key,
    ncclComm_t* newcomm,
    ncclConfig_t* config) {
  FakeNccl::Comm* parent = fakeOf(comm);
  const Call call("ncclCommSplit", parent);
  if (call.result != ncclSuccess && call.result != ncclInProgress) {
    return call.result;
  }
  *newcomm = nullptr;
  if (color != NCCL_SPLIT_NOCOLOR) {
    FakeNccl::current().derive(parent, key, parent->size, newcomm, config);
  }
  return call.result;
}

ncclResult_t shrinkComm(
    ncclComm_t comm,
    int* excludeRanksList,
    int excludeRanksCount,
    ncclComm_t* newcomm,
    ncclConfig_t* config,
    int shrinkFlags) {
  FakeNccl::Comm* parent = fakeOf(comm);
  const Call call("ncclCommShrink", parent);
  FakeNccl::current().noteShrinkFlags(shrinkFlags);
  if (call.result != ncclSuccess && call.result != ncclInProgress) {
    return call.result;
  }
  // The ranks that stay keep their order.
  const int below = static_cast<int>(std::count_if(
      excludeRanksList, excludeRanksList + excludeRanksCount, [&](int rank) {
        return rank < parent->rank;
      }));
  FakeNccl::current().derive(
      parent,
      parent->rank - below,
      parent->size - excludeRanksCount,
      newcomm,
      config);
  return call.result;
}

// The existing ranks keep theirs; a joining process (no parent) takes `rank`.
// As NCCL, the grow is the new communicator's job: held, a nonblocking one
// stays in progress while the call answers ncclSuccess (init.cc).
ncclResult_t growComm(
    ncclComm_t comm,
    int nRanks,
    const ncclUniqueId* /*id*/,
    int rank,
    ncclComm_t* newcomm,
    ncclConfig_t* config) {
  FakeNccl::Comm* parent = comm == nullptr ? nullptr : fakeOf(comm);
  FakeNccl::Comm* made = FakeNccl::current().make(
      parent != nullptr ? parent->rank : rank,
      nRanks,
      config,
      parent == nullptr || parent->blocking);
  *newcomm = handleOf(made);
  const Call call("ncclCommGrow", made);
  return call.result == ncclInProgress ? ncclSuccess : call.result;
}

ncclResult_t userRank(ncclComm_t comm, int* rank) {
  *rank = fakeOf(comm)->rank;
  return Call("ncclCommUserRank", fakeOf(comm)).result;
}

ncclResult_t count(ncclComm_t comm, int* size) {
  *size = fakeOf(comm)->size;
  return Call("ncclCommCount", fakeOf(comm)).result;
}

ncclResult_t asyncError(ncclComm_t comm, ncclResult_t* state) {
  return FakeNccl::current().asyncState(fakeOf(comm), state);
}

ncclResult_t abortComm(ncclComm_t comm) {
  FakeNccl::current().abort(fakeOf(comm));
  return ncclSuccess;
}

ncclResult_t finalizeComm(ncclComm_t comm) {
  FakeNccl::Comm* fake = fakeOf(comm);
  if (!FakeNccl::current().startFinalize(fake)) {
    return ncclInvalidArgument;
  }
  return Call("ncclCommFinalize", fake).result;
}

ncclResult_t revokeComm(ncclComm_t comm, int /*flags*/) {
  return FakeNccl::current().revoke(fakeOf(comm));
}

// NCCL >= 2.29.7's suspend: a second suspend or resume in a row is
// misuse, as NCCL's own memory manager says (ncclInvalidUsage).
ncclResult_t suspendComm(ncclComm_t comm, int /*flags*/) {
  FakeNccl::Comm* fake = fakeOf(comm);
  const Call call("ncclCommSuspend", fake);
  if (call.result != ncclSuccess || fake->suspended) {
    return call.result != ncclSuccess ? call.result : ncclInvalidUsage;
  }
  fake->suspended = true;
  return ncclSuccess;
}

ncclResult_t resumeComm(ncclComm_t comm) {
  FakeNccl::Comm* fake = fakeOf(comm);
  const Call call("ncclCommResume", fake);
  if (call.result != ncclSuccess || !fake->suspended) {
    return call.result != ncclSuccess ? call.result : ncclInvalidUsage;
  }
  fake->suspended = false;
  return ncclSuccess;
}

ncclResult_t memStats(ncclComm_t comm, int stat, uint64_t* value) {
  FakeNccl::Comm* fake = fakeOf(comm);
  const Call call("ncclCommMemStats", fake);
  constexpr uint64_t kSuspendable = FakeNccl::kSuspendableBytes;
  constexpr uint64_t kPersistent = FakeNccl::kPersistentBytes;
  switch (stat) {
    case kMemStatSuspendable:
      *value = kSuspendable;
      break;
    case kMemStatSuspended:
      *value = fake->suspended ? 1 : 0;
      break;
    case kMemStatPersistent:
      *value = kPersistent;
      break;
    case kMemStatTotal:
      *value = kSuspendable + kPersistent;
      break;
    default:
      return ncclInvalidArgument;
  }
  return call.result;
}

// The fake communicator among an entry point's arguments, if this one is it.
template <typename Arg>
FakeNccl::Comm* commAmong(FakeNccl::Comm* found, Arg arg) {
  if constexpr (std::is_same_v<Arg, ncclComm_t>) {
    return fakeOf(arg);
  } else {
    return found;
  }
}

template <typename>
constexpr bool kUnknownArgument = false;

// An argument of a collective or point-to-point call, in its record: each
// kind of argument has a type of its own in nccl.h.
template <typename Arg>
void describe(FakeNccl::Record& record, Arg arg) {
  if constexpr (std::is_same_v<Arg, ncclComm_t>) {
    record.rank = fakeOf(arg)->rank;
  } else if constexpr (std::is_same_v<Arg, cudaStream_t>) {
    record.stream = reinterpret_cast<uintptr_t>(arg);
  } else if constexpr (std::is_pointer_v<Arg>) {
    record.buffers.push_back(reinterpret_cast<uintptr_t>(arg));
  } else if constexpr (std::is_same_v<Arg, size_t>) {
    record.count = arg;
  } else if constexpr (std::is_same_v<Arg, ncclDataType_t>) {
    record.dtype = arg;
  } else if constexpr (std::is_same_v<Arg, ncclRedOp_t>) {
    record.op = arg;
  } else if constexpr (std::is_same_v<Arg, int>) {
    record.peer = arg;
  } else {
    static_assert(kUnknownArgument<Arg>, "an argument of unknown meaning");
  }
}

// Collectives and point-to-point calls enqueue nothing: on a GPU machine the
// backend's own host time per call can then be told from NCCL's
// (benchmarks/collectives.py --noop-nccl). One template serves every
// signature: the call is counted on the communicator it names, and recorded.
template <const char* kCall, typename... Args>
ncclResult_t enqueueNothing(Args... args) {
  FakeNccl::Comm* comm = nullptr;
  ((comm = commAmong(comm, args)), ...);
  if (FakeNccl::current().recording()) {
    FakeNccl::Record record;
    record.call = kCall;
    (describe(record, args), ...);
    FakeNccl::current().note(std::move(record));
  }
  return Call(kCall, comm).result;
}

// Points `entry` at enqueueNothing for its own signature.
template <const char* kCall, typename... Args>
void scriptNothing(ncclResult_t (*&entry)(Args...)) {
  entry = &enqueueNothing<kCall, Args...>;
}

constexpr char kAllReduce[] = "ncclAllReduce";
constexpr char kBroadcast[] = "ncclBroadcast";
constexpr char kReduce[] = "ncclReduce";
constexpr char kAllGather[] = "ncclAllGather";
constexpr char kReduceScatter[] = "ncclReduceScatter";
constexpr char kSend[] = "ncclSend";
constexpr char kRecv[] = "ncclRecv";

// Registrations and windows get distinct handles that stand for nothing:
// routing's tests count them.
void* nextHandle() {
  static std::atomic<uintptr_t> handles{0};
  return reinterpret_cast<void*>(++handles);
}

ncclResult_t registerBuffer(ncclComm_t comm, void*, size_t, void** handle) {
  const Call call("ncclCommRegister", fakeOf(comm));
  *handle = nextHandle();
  return call.result;
}

ncclResult_t deregisterBuffer(ncclComm_t comm, void*) {
  return Call("ncclCommDeregister", fakeOf(comm)).result;
}

ncclResult_t
registerWindow(ncclComm_t comm, void*, size_t, ncclWindow_t* window, int) {
  const Call call("ncclCommWindowRegister", fakeOf(comm));
  *window = static_cast<ncclWindow_t>(nextHandle());
  return call.result;
}

ncclResult_t deregisterWindow(ncclComm_t comm, ncclWindow_t) {
  return Call("ncclCommWindowDeregister", fakeOf(comm)).result;
}

ncclResult_t getUniqueId(ncclUniqueId* id) {
  // A new id each call, as NCCL's: tests can tell communicators' ids apart.
  static std::atomic<uint64_t> made{0};
  const uint64_t serial = made.fetch_add(1) + 1;
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, &serial, sizeof(serial));
  return ncclSuccess;
}

ncclResult_t growId(ncclComm_t comm, ncclUniqueId* id) {
  getUniqueId(id);
  return Call("ncclCommGetUniqueId", fakeOf(comm)).result;
}

const char* lastError(ncclComm_t /*comm*/) {
  return "fake NCCL";
}

ncclResult_t noteGroupCall(const char* call) {
  FakeNccl& fake = FakeNccl::current();
  if (fake.recording()) {
    FakeNccl::Record record;
    record.call = call;
    fake.note(std::move(record));
  }
  return ncclSuccess;
}

ncclResult_t groupStart() {
  return noteGroupCall("ncclGroupStart");
}

ncclResult_t groupEnd() {
  return noteGroupCall("ncclGroupEnd");
}

cudaError_t getDevice(int* device) {
  *device = currentDevice;
  return cudaSuccess;
}

cudaError_t setDevice(int device) {
  currentDevice = device;
  return cudaSuccess;
}

cudaError_t exchangeCaptureMode(cudaStreamCaptureMode* /*mode*/) {
  return cudaSuccess;
}

// Any memory can be a window, an allocation of its own, unless a test
// scripts a refusal (failNext("windowable", ...)).
std::optional<WindowPlace> windowPlace(const void* /*ptr*/, size_t bytes) {
  if (Call("windowable", nullptr).result != ncclSuccess) {
    return std::nullopt;
  }
  return WindowPlace{bytes, 0};
}

} // namespace

FakeNccl::FakeNccl(bool realCuda, bool revoke, bool suspend, bool grow) {
  table_.getVersion = realNccl().getVersion; // features stay the runtime's
  table_.getErrorString = realNccl().getErrorString;
  table_.getUniqueId = &getUniqueId;
  table_.getLastError = &lastError;
  table_.commInitRankConfig = &initRankConfig;
  table_.commSplit = &splitComm;
  table_.commShrink = &shrinkComm;
  table_.commUserRank = &userRank;
  table_.commCount = &count;
  table_.commGetAsyncError = &asyncError;
  table_.commAbort = &abortComm;
  table_.commFinalize = &finalizeComm;
  table_.commRevoke = revoke ? &revokeComm : nullptr;
  table_.commSuspend = suspend ? &suspendComm : nullptr;
  table_.commResume = suspend ? &resumeComm : nullptr;
  table_.commMemStats = suspend ? &memStats : nullptr;
  table_.commGetUniqueId = grow ? &growId : nullptr;
  table_.commGrow = grow ? &growComm : nullptr;
  table_.groupStart = &groupStart;
  table_.groupEnd = &groupEnd;
  scriptNothing<kAllReduce>(table_.allReduce);
  scriptNothing<kBroadcast>(table_.broadcast);
  scriptNothing<kReduce>(table_.reduce);
  scriptNothing<kAllGather>(table_.allGather);
  scriptNothing<kReduceScatter>(table_.reduceScatter);
  scriptNothing<kSend>(table_.send);
  scriptNothing<kRecv>(table_.recv);
  table_.commRegister = &registerBuffer;
  table_.commDeregister = &deregisterBuffer;
  table_.commWindowRegister = &registerWindow;
  table_.commWindowDeregister = &deregisterWindow;
  table_.getDevice = realCuda ? realNccl().getDevice : &getDevice;
  table_.setDevice = realCuda ? realNccl().setDevice : &setDevice;
  table_.exchangeStreamCaptureMode =
      realCuda ? realNccl().exchangeStreamCaptureMode : &exchangeCaptureMode;
  table_.windowPlace = &windowPlace;
  FakeNccl* expected = nullptr;
  TORCH_CHECK(
      installedFake.compare_exchange_strong(expected, this),
      "a FakeNccl is installed already");
}

FakeNccl::~FakeNccl() {
  uninstall();
}

void FakeNccl::uninstall() {
  FakeNccl* expected = this;
  installedFake.compare_exchange_strong(expected, nullptr);
}

FakeNccl& FakeNccl::current() {
  FakeNccl* fake = installedFake.load();
  TORCH_INTERNAL_ASSERT(fake != nullptr, "no FakeNccl is installed");
  return *fake;
}

void FakeNccl::hold(const std::string& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.insert(call);
}

void FakeNccl::release(const std::string& call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.erase(call);
  }
  released_.notify_all();
}

void FakeNccl::failNext(const std::string& call, int result) {
  std::lock_guard<std::mutex> lock(mutex_);
  failNext_[call] = result;
}

void FakeNccl::setAsyncError(int result) {
  std::lock_guard<std::mutex> lock(mutex_);
  asyncError_ = static_cast<ncclResult_t>(result);
}

void FakeNccl::record(bool on) {
  recording_.store(on, std::memory_order_relaxed);
}

std::vector<FakeNccl::Record> FakeNccl::takeRecorded() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(recorded_, {});
}

void FakeNccl::note(Record record) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorded_.push_back(std::move(record));
}

int FakeNccl::calls(const std::string& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_[call];
}

int FakeNccl::inside(const std::string& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  return inside_[call];
}

int FakeNccl::live() {
  std::lock_guard<std::mutex> lock(mutex_);
  int count = 0;
  for (const auto& comm : comms_) {
    count += comm->freed ? 0 : 1;
  }
  return count;
}

int FakeNccl::abortedUnderCall() {
  std::lock_guard<std::mutex> lock(mutex_);
  return abortedUnderCall_;
}

int FakeNccl::usedAfterFree() {
  std::lock_guard<std::mutex> lock(mutex_);
  return usedAfterFree_;
}

FakeNccl::Comm* FakeNccl::make(
    int rank,
    int size,
    const ncclConfig_t* config,
    bool parentBlocks) {
  std::lock_guard<std::mutex> lock(mutex_);
  return makeLocked(rank, size, config, parentBlocks);
}

void FakeNccl::derive(
    Comm* parent,
    int rank,
    int size,
    ncclComm_t* child,
    const ncclConfig_t* config) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!parent->pending.empty()) {
    parent->pendingChild = child;
    parent->pendingConfig = config;
    parent->pendingRank = rank;
    parent->pendingSize = size;
  } else {
    *child = handleOf(makeLocked(rank, size, config, parent->blocking));
  }
}

int FakeNccl::lastShrinkFlags() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lastShrinkFlags_;
}

void FakeNccl::noteShrinkFlags(int flags) {
  std::lock_guard<std::mutex> lock(mutex_);
  lastShrinkFlags_ = flags;
}

FakeNccl::Comm* FakeNccl::makeLocked(
    int rank,
    int size,
    const ncclConfig_t* config,
    bool parentBlocks) {
  const bool blocking =
      config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT
          ? parentBlocks
          : config->blocking != 0;
  comms_.push_back(std::make_unique<Comm>(Comm{rank, size, blocking}));
  return comms_.back().get();
}

ncclResult_t FakeNccl::enter(const char* call, Comm* comm) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++calls_[call];
  ++inside_[call];
  if (comm != nullptr) {
    usedAfterFree_ += comm->freed ? 1 : 0;
    ++comm->inside;
  }
  if (held_.count(call) != 0) {
    if (comm != nullptr && !comm->blocking) {
      comm->pending = call;
      return ncclInProgress;
    }
    released_.wait(lock, [&] {
      return held_.count(call) == 0 || (comm != nullptr && comm->revoked);
    });
    if (comm != nullptr && comm->revoked) {
      return ncclInternalError; // as NCCL's bootstrap does on its abort flag
    }
  }
  const auto failure = failNext_.find(call);
  if (failure != failNext_.end()) {
    const auto result = static_cast<ncclResult_t>(failure->second);
    failNext_.erase(failure);
    return result;
  }
  return ncclSuccess;
}

void FakeNccl::leave(const char* call, Comm* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  --inside_[call];
  if (comm != nullptr) {
    --comm->inside;
  }
}

ncclResult_t FakeNccl::asyncState(Comm* comm, ncclResult_t* state) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_["ncclCommGetAsyncError"];
  usedAfterFree_ += comm->freed ? 1 : 0;
  if (!comm->pending.empty()) {
    if (held_.count(comm->pending) != 0) {
      *state = ncclInProgress;
      return ncclSuccess;
    }
    comm->pending.clear();
    if (comm->pendingChild != nullptr) {
      *std::exchange(comm->pendingChild, nullptr) = handleOf(makeLocked(
          comm->pendingRank,
          comm->pendingSize,
          comm->pendingConfig,
          comm->blocking));
    }
  }
  *state = asyncError_;
  return ncclSuccess;
}

bool FakeNccl::startFinalize(Comm* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm->finalizing) {
    ++calls_["ncclCommFinalize"];
    return false;
  }
  comm->finalizing = true;
  return true;
}

ncclResult_t FakeNccl::revoke(Comm* comm) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_["ncclCommRevoke"];
    usedAfterFree_ += comm->freed ? 1 : 0;
    if (std::exchange(comm->finalizing, true)) {
      return ncclInvalidArgument;
    }
    comm->revoked = true;
  }
  released_.notify_all();
  return ncclSuccess;
}

void FakeNccl::abort(Comm* comm) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++calls_["ncclCommAbort"];
  abortedUnderCall_ += comm->inside > 0 ? 1 : 0;
  usedAfterFree_ += comm->freed ? 1 : 0;
  // Held, it blocks as NCCL's does while the device finishes.
  ++inside_["ncclCommAbort"];
  released_.wait(lock, [&] { return held_.count("ncclCommAbort") == 0; });
  --inside_["ncclCommAbort"];
  comm->freed = true;
}

} // namespace nccl_core

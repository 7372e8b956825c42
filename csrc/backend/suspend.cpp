// NcclCoreBackend's suspend and resume: NCCL's ncclCommSuspend / ncclCommResume
// / ncclCommMemStats over the group's communicator and its window-free twin.
// Suspend and resume are collective in NCCL (a barrier of every rank in its
// memory manager), so the ranks first agree in the store that every one of
// them can go ahead: either all call NCCL or none does, and a refusal leaves
// the group usable on every rank.

#include "backend/backend.h"
#include "nccl/errors.h"

namespace nccl_core {

std::vector<std::shared_ptr<Communicator>>
NcclCoreBackend::madeCommunicators() {
  std::vector<std::shared_ptr<Communicator>> comms;
  if (comm_) {
    comms.push_back(comm_);
  }
  if (auto twin = windowFreeTwin()) {
    comms.push_back(std::move(twin));
  }
  return comms;
}

std::string NcclCoreBackend::suspendRefusal() {
  if (failure_->failed()) {
    return c10::str("the group has failed: ", failure_->message());
  }
  if (runner_.coalescing()) {
    return "a coalescing block is open; end it first";
  }
  for (const auto& comm : madeCommunicators()) {
    if (comm->liveGraphs() > 0) {
      return c10::str(
          comm->liveGraphs(),
          " CUDA graph(s) that captured ops of the group are alive, and a "
          "replay would use the memory NCCL releases; destroy them first");
    }
  }
  if (watchdog_ && !watchdog_->quiescent()) {
    return "ops of the group have not finished on the GPU, and NCCL would "
           "release memory they use; wait for them (Work.wait() and a "
           "synchronize of their streams) first";
  }
  return "";
}

void NcclCoreBackend::agreeToGoAhead(const char* op, const std::string& mine) {
  const int64_t refusing = agreement_.meetNext(op, mine.empty() ? 0 : 1);
  failure_->raiseIfFailed();
  NCCL_CORE_CHECK_STATE(
      refusing == 0,
      op,
      "group '",
      *groupName_,
      "' did not ",
      op,
      ": ",
      mine.empty()
          ? c10::str(refusing, " of its ranks could not (see their errors)")
          : c10::str("on this rank ", mine));
}

void NcclCoreBackend::runSuspendCall(
    const char* op,
    void (Communicator::*call)()) {
  const auto comms = madeCommunicators();
  if (comms.empty()) {
    return; // no communicator yet: NCCL holds no memory for the group
  }
  // Timed like an op: a rank that never comes is ended by the watchdog's
  // abort, which revokes the communicator under the call.
  const uint64_t seq = runner_.nextSeq();
  const Watchdog::Enqueueing timed(*watchdog_, op, seq, timeout_.load());
  for (size_t done = 0; done < comms.size(); ++done) {
    try {
      ((*comms[done]).*call)();
    } catch (const c10::DistBackendError& e) {
      failSuspendCall(op, seq, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      if (done == 0) {
        throw; // NCCL refused before its barrier, on every rank alike
      }
      failSuspendCall(op, seq, e.what_without_backtrace());
    }
  }
}

void NcclCoreBackend::failSuspendCall(
    const char* op,
    uint64_t seq,
    const std::string& cause) {
  // Another collective call could not undo a half-done one on every rank.
  const std::string reason = c10::str(
      "nccl_core ",
      op,
      " (seq ",
      seq,
      ") on group '",
      *groupName_,
      "' failed: ",
      cause);
  watchdog_->fail(reason, /*tellPeers=*/true);
  C10_THROW_ERROR(DistBackendError, reason);
}

void NcclCoreBackend::suspendGroup() {
  constexpr const char* kOp = "suspend";
  Communicator::requireSuspendSupport(*options_->api, kOp);
  if (suspendState_.load() == SuspendState::Suspended) {
    return;
  }
  // Ops of other threads are refused from here on: none starts while the
  // ranks decide.
  suspendState_.store(SuspendState::Suspending);
  try {
    agreeToGoAhead(kOp, suspendRefusal());
    runSuspendCall(kOp, &Communicator::suspend);
  } catch (...) {
    suspendState_.store(SuspendState::Active);
    throw;
  }
  suspendState_.store(SuspendState::Suspended);
}

void NcclCoreBackend::resumeGroup() {
  constexpr const char* kOp = "resume";
  Communicator::requireSuspendSupport(*options_->api, kOp);
  failure_->raiseIfFailed();
  if (suspendState_.load() != SuspendState::Suspended) {
    return;
  }
  runSuspendCall(kOp, &Communicator::resume);
  suspendState_.store(SuspendState::Active);
}

std::unordered_map<std::string, uint64_t> NcclCoreBackend::groupMemoryStats() {
  Communicator::requireSuspendSupport(*options_->api, "memory_stats");
  failure_->raiseIfFailed();
  std::unordered_map<std::string, uint64_t> stats{
      {"suspend", 0},
      {"suspended", suspendState_.load() == SuspendState::Suspended ? 1 : 0},
      {"persist", 0},
      {"total", 0}};
  for (const auto& comm : madeCommunicators()) {
    const Communicator::MemoryStats made = comm->memoryStats();
    stats["suspend"] += made.suspendable;
    stats["persist"] += made.persistent;
    stats["total"] += made.total;
  }
  return stats;
}

} // namespace nccl_core

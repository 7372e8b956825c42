// NcclCoreBackend's memory offload: NCCL's ncclCommSuspend / ncclCommResume /
// ncclCommMemStats over the group's communicator and its window-free twin,
// with the states in which releasing NCCL's memory would break an op refused
// before NCCL is called.
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

void NcclCoreBackend::suspendGroup() {
  constexpr const char* kOp = "suspend";
  Communicator::requireSuspendSupport(kOp);
  failure_->raiseIfFailed();
  NCCL_CORE_CHECK_STATE(
      !coalescing_,
      kOp,
      "group '",
      *groupName_,
      "' is inside a coalescing block; end it first");
  if (suspended_.load()) {
    return;
  }
  const auto comms = madeCommunicators();
  for (const auto& comm : comms) {
    NCCL_CORE_CHECK_STATE(
        comm->liveGraphs() == 0,
        kOp,
        comm->liveGraphs(),
        " CUDA graph(s) that captured ops of group '",
        *groupName_,
        "' are alive, and a replay would use the memory NCCL releases; "
        "destroy them first");
  }
  NCCL_CORE_CHECK_STATE(
      !watchdog_ || watchdog_->idle(),
      kOp,
      "ops of group '",
      *groupName_,
      "' have not finished, and NCCL would release memory they use; wait for "
      "them (Work.wait() and a synchronize of their streams) first");
  for (size_t done = 0; done < comms.size(); ++done) {
    try {
      comms[done]->suspend();
    } catch (...) {
      for (size_t i = 0; i < done; ++i) {
        comms[i]->resume(); // all or nothing
      }
      throw;
    }
  }
  suspended_.store(true);
}

void NcclCoreBackend::resumeGroup() {
  Communicator::requireSuspendSupport("resume");
  failure_->raiseIfFailed();
  if (!suspended_.load()) {
    return;
  }
  for (const auto& comm : madeCommunicators()) {
    comm->resume();
  }
  suspended_.store(false);
}

std::unordered_map<std::string, uint64_t> NcclCoreBackend::groupMemoryStats() {
  Communicator::requireSuspendSupport("memory_stats");
  failure_->raiseIfFailed();
  std::unordered_map<std::string, uint64_t> stats{
      {"suspend", 0},
      {"suspended", suspended_.load() ? 1 : 0},
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

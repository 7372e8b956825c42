#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <limits>
#include <nccl_device.h>

#include "nccl/api.h"
#include "nccl/capabilities.h"
#include "nccl/communicator.h"
#include "nccl/dev_comm.h"
#include "nccl/errors.h"
#include "nccl/version.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

const ncclDevComm_t& devCommOf(const std::shared_ptr<void>& devComm) {
  return *static_cast<const ncclDevComm_t*>(devComm.get());
}

ncclDevCommRequirements_t defaultRequirements() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  return NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  return ncclDevCommRequirements_t{}; // 2.28: zero means NCCL's default
#endif
}

void setField(
    ncclDevCommRequirements_t& r,
    const std::string& name,
    int64_t value) {
  NCCL_CORE_CHECK_ARG(
      value >= 0 && value <= std::numeric_limits<int>::max(),
      "create_dev_comm",
      "requirement '",
      name,
      "' must be in [0, 2**31 - 1], got ",
      value);
  const int v = static_cast<int>(value);
  if (name == "lsa_multimem") {
    r.lsaMultimem = v != 0;
  } else if (name == "barrier_count") {
    r.barrierCount = v;
  } else if (name == "lsa_barrier_count") {
    r.lsaBarrierCount = v;
  } else if (name == "rail_gin_barrier_count") {
    r.railGinBarrierCount = v;
  } else if (name == "lsa_ll_a2a_block_count") {
    r.lsaLLA2ABlockCount = v;
  } else if (name == "lsa_ll_a2a_slot_count") {
    r.lsaLLA2ASlotCount = v;
  } else if (name == "gin_force_enable") {
    r.ginForceEnable = v != 0;
  } else if (name == "gin_context_count") {
    r.ginContextCount = v;
  } else if (name == "gin_signal_count") {
    r.ginSignalCount = v;
  } else if (name == "gin_counter_count") {
    r.ginCounterCount = v;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  } else if (name == "gin_connection_type") {
    r.ginConnectionType = static_cast<ncclGinConnectionType_t>(v);
  } else if (name == "gin_exclusive_contexts") {
    r.ginExclusiveContexts = v != 0;
  } else if (name == "gin_queue_depth") {
    r.ginQueueDepth = v;
  } else if (name == "gin_traffic_class") {
    r.ginTrafficClass = v;
  } else if (name == "world_gin_barrier_count") {
    r.worldGinBarrierCount = v;
  } else if (name == "gin_strong_signals_required") {
    r.ginStrongSignalsRequired = v != 0;
  } else if (name == "gin_va_signals_required") {
    r.ginVaSignalsRequired = v != 0;
#endif
  } else {
    NCCL_CORE_CHECK_SUPPORTED(
        false,
        "create_dev_comm",
        "requirement '",
        name,
        "' is not in the NCCL ",
        NCCL_MAJOR,
        ".",
        NCCL_MINOR,
        " this extension was built against (it may need a newer NCCL)");
  }
}

} // namespace

DevComm::DevComm(
    std::weak_ptr<Communicator> comm,
    std::shared_ptr<void> devComm)
    : CommResource(std::move(comm), std::nullopt),
      devComm_(std::move(devComm)) {}

uintptr_t DevComm::ptr() const {
  requireValid();
  return reinterpret_cast<uintptr_t>(devComm_.get());
}

int DevComm::lsaRank() const {
  requireValid();
  return devCommOf(devComm_).lsaRank;
}

int DevComm::lsaSize() const {
  requireValid();
  return devCommOf(devComm_).lsaSize;
}

void DevComm::release(const NcclApi& api, ncclComm_t comm) noexcept {
  NCCL_CORE_WARN(api, api.devCommDestroy(comm, &devCommOf(devComm_)));
}

namespace {
// Peers outside this rank's LSA team (other nodes, or ranks sharing a GPU as
// nodes) are reached only through GPU-initiated networking: refused here,
// before NCCL, where it has none (NCCL's own refusal leaves the communicator
// unfit for later window registrations).
void requireEveryPeerReachable(Communicator& comm) {
  const int lsaSize = lsaTeam(comm).size;
  if (lsaSize == comm.size()) {
    return;
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  const bool gin =
      queryCapabilities(comm, "create_dev_comm").ginType != NCCL_GIN_TYPE_NONE;
  const char* why = "NCCL has no GPU-initiated networking (GIN) on it";
#else
  const bool gin = false;
  const char* why =
      "telling whether GPU-initiated networking (GIN) reaches them needs an "
      "extension built against NCCL >= 2.29";
#endif
  NCCL_CORE_CHECK_SUPPORTED(
      gin,
      "create_dev_comm",
      comm.size() - lsaSize,
      " of the ",
      comm.size(),
      " ranks of ",
      comm.label(),
      " are not load/store reachable from this rank (no NVLink or PCIe P2P "
      "mapping), and ",
      why);
}
} // namespace

std::shared_ptr<DevComm> createDevComm(
    Communicator& comm,
    const std::map<std::string, int64_t>& requirements) {
  requireBuildRelease("create_dev_comm");
  requireEveryPeerReachable(comm);
  ncclDevCommRequirements_t r = defaultRequirements();
  for (const auto& [name, value] : requirements) {
    setField(r, name, value);
  }
  auto devComm = std::make_shared<ncclDevComm_t>();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
  ncclResult_t result = ncclSuccess;
  {
    // Collective: an abort revokes the communicator to end the wait.
    const Communicator::HostCall inside(comm);
    result = comm.api().devCommCreate(inside.handle(), &r, devComm.get());
  }
  comm.check(result, "ncclDevCommCreate");
  return comm.adoptDevComm(std::static_pointer_cast<void>(devComm));
}

} // namespace nccl_core

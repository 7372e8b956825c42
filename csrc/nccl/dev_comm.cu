#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <limits>
#include <nccl_device.h>
#include <string_view>
#include <type_traits>

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

using Requirements = ncclDevCommRequirements_t;

// Requirement `field` set to `value` (bool fields: nonzero; enums: their
// ncclGin* value), as DevCommRequirements._nccl_fields gives them.
template <auto field>
void set(Requirements& r, int value) {
  using Field = std::remove_reference_t<decltype(r.*field)>;
  r.*field = static_cast<Field>(value);
}

struct RequirementField {
  std::string_view name; // DevCommRequirements' (nccl4py's) name
  void (*assign)(Requirements&, int);
};

// clang-format off: a table, one requirement a row
constexpr RequirementField kRequirementFields[] = {
    {"lsa_multimem", set<&Requirements::lsaMultimem>},
    {"barrier_count", set<&Requirements::barrierCount>},
    {"lsa_barrier_count", set<&Requirements::lsaBarrierCount>},
    {"rail_gin_barrier_count", set<&Requirements::railGinBarrierCount>},
    {"lsa_ll_a2a_block_count", set<&Requirements::lsaLLA2ABlockCount>},
    {"lsa_ll_a2a_slot_count", set<&Requirements::lsaLLA2ASlotCount>},
    {"gin_force_enable", set<&Requirements::ginForceEnable>},
    {"gin_context_count", set<&Requirements::ginContextCount>},
    {"gin_signal_count", set<&Requirements::ginSignalCount>},
    {"gin_counter_count", set<&Requirements::ginCounterCount>},
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
    {"gin_connection_type", set<&Requirements::ginConnectionType>},
    {"gin_exclusive_contexts", set<&Requirements::ginExclusiveContexts>},
    {"gin_queue_depth", set<&Requirements::ginQueueDepth>},
    {"gin_traffic_class", set<&Requirements::ginTrafficClass>},
    {"world_gin_barrier_count", set<&Requirements::worldGinBarrierCount>},
    {"gin_strong_signals_required", set<&Requirements::ginStrongSignalsRequired>},
    {"gin_va_signals_required", set<&Requirements::ginVaSignalsRequired>},
#endif
};
// clang-format on

void setField(Requirements& r, const std::string& name, int64_t value) {
  NCCL_CORE_CHECK_ARG(
      value >= 0 && value <= std::numeric_limits<int>::max(),
      "create_dev_comm",
      "requirement '",
      name,
      "' must be in [0, 2**31 - 1], got ",
      value);
  for (const RequirementField& field : kRequirementFields) {
    if (field.name == name) {
      field.assign(r, static_cast<int>(value));
      return;
    }
  }
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

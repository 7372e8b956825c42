// Communicator's part in NCCL's elastic grow (ncclCommGrow,
// ncclCommGetUniqueId; NCCL >= 2.29): the ranks of a communicator make a
// larger one with processes that join it, keeping their rank numbers.
#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"

namespace nccl_core {

void Communicator::requireGrowSupport(const char* op) {
  const NcclApi& api = nccl();
  NCCL_CORE_CHECK_SUPPORTED(
      api.commGrow != nullptr && api.commGetUniqueId != nullptr,
      op,
      "needs NCCL >= 2.29 (ncclCommGrow, ncclCommGetUniqueId); NCCL ",
      versionText(runtimeVersion().code),
      " is loaded");
}

ncclUniqueId Communicator::growId() {
  requireGrowSupport("grow");
  DeviceGuard guard(device_);
  ncclUniqueId id{};
  ncclResult_t result = ncclSuccess;
  {
    // Sends the id to this communicator's first and last ranks, which take
    // it inside their grow (NCCL's bootstrap).
    const HostCall inside(*this);
    result = nccl().commGetUniqueId(inside.handle(), &id);
  }
  check(result, "ncclCommGetUniqueId");
  return id;
}

std::shared_ptr<Communicator> Communicator::grow(
    int newSize,
    const ncclUniqueId* id,
    ncclConfig_t config,
    std::string label) {
  requireGrowSupport("grow");
  return derive(
      "ncclCommGrow",
      config,
      std::move(label),
      [&](ncclComm_t parent, ncclComm_t* child) {
        return nccl().commGrow(parent, newSize, id, -1, child, &config);
      });
}

} // namespace nccl_core

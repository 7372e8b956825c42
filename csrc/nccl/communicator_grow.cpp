// Communicator's part in NCCL's elastic grow (ncclCommGrow,
// ncclCommGetUniqueId; NCCL >= 2.29): the ranks of a communicator make a
// larger one with processes that join it, keeping their rank numbers.
#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"

namespace nccl_core {

void Communicator::requireGrowSupport(const NcclApi& api, const char* op) {
  NCCL_CORE_CHECK_SUPPORTED(
      api.commGrow != nullptr && api.commGetUniqueId != nullptr,
      op,
      "needs NCCL >= 2.29 (ncclCommGrow, ncclCommGetUniqueId); NCCL ",
      versionText(runtimeVersion().code),
      " is loaded");
}

ncclUniqueId Communicator::growId() {
  requireGrowSupport(*api_, "grow");
  DeviceGuard guard(*api_, device_);
  ncclUniqueId id{};
  ncclResult_t result = ncclSuccess;
  {
    // Sends the id to this communicator's first and last ranks, which take
    // it inside their grow (NCCL's bootstrap).
    const HostCall inside(*this);
    result = api_->commGetUniqueId(inside.handle(), &id);
  }
  check(result, "ncclCommGetUniqueId");
  return id;
}

std::shared_ptr<Communicator> Communicator::grow(
    int newSize,
    const ncclUniqueId* id,
    ncclConfig_t config,
    std::string label) {
  requireGrowSupport(*api_, "grow");
  DeviceGuard guard(*api_, device_);
  ncclComm_t child = nullptr;
  ncclResult_t result = ncclSuccess;
  {
    const HostCall inside(*this);
    result = api_->commGrow(inside.handle(), newSize, id, -1, &child, &config);
  }
  if (child == nullptr) {
    if (isAborted()) {
      raiseAborted(); // the abort ended the call
    }
    throwNcclError(result, "ncclCommGrow", __FILE__, __LINE__, *api_, comm_);
  }
  // Owned before it settles: a failed or late grow aborts it.
  auto grown = adopt(
      child,
      rank_,
      newSize,
      {api_, device_, config, timeout(), std::move(label)});
  grown->settleGrow(result);
  return grown;
}

void Communicator::settleGrow(ncclResult_t result) {
  // NCCL runs a grow as the new communicator's own job, and may answer
  // ncclSuccess before that settled (init.cc): a nonblocking one is polled.
  check(
      result == ncclSuccess && nonblocking_ ? ncclInProgress : result,
      "ncclCommGrow");
}

} // namespace nccl_core

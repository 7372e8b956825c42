#include "nccl/capabilities.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <optional>

#include <nccl_device.h>

#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"

namespace nccl_core {

void requireBuildRelease(const char* op) {
  const NcclVersion& runtime = runtimeVersion();
  NCCL_CORE_CHECK_SUPPORTED(
      runtime.major == NCCL_MAJOR && runtime.minor == NCCL_MINOR,
      op,
      "needs the NCCL release this extension was built against (",
      NCCL_MAJOR,
      ".",
      NCCL_MINOR,
      "), but NCCL ",
      runtime.major,
      ".",
      runtime.minor,
      " is loaded: the device API's structures differ between releases");
}

CommCapabilities queryCapabilities(Communicator& comm, const char* op) {
  CommCapabilities made;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  requireBuildRelease(op);
  const auto query = comm.api().commQueryProperties;
  NCCL_CORE_CHECK_SUPPORTED(
      query != nullptr, op, "NCCL has no ncclCommQueryProperties");
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  comm.check(query(comm.get(), &props), "ncclCommQueryProperties");
  made.deviceApi = props.deviceApiSupport;
  made.ginType = static_cast<int>(props.ginType);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 7)
  made.hostRma = props.hostRmaSupport;
  made.railedGinType = static_cast<int>(props.railedGinType);
  made.lsaTeams = props.nLsaTeams;
#endif
#else
  (void)comm;
  NCCL_CORE_CHECK_SUPPORTED(
      false,
      op,
      "needs NCCL >= 2.29 (ncclCommQueryProperties); this extension was built "
      "against NCCL ",
      NCCL_MAJOR,
      ".",
      NCCL_MINOR);
#endif
  return made;
}

namespace {
// What NCCL gave `comm`, where NCCL can say (>= 2.29, the build's release).
std::optional<CommCapabilities>
knownCapabilities(Communicator& comm, const char* op) {
  if (runtimeVersion().code < NCCL_VERSION(2, 29, 0)) {
    return std::nullopt;
  }
  try {
    return queryCapabilities(comm, op);
  } catch (const c10::NotImplementedError&) {
    return std::nullopt;
  }
}
} // namespace

bool supportsWindows(Communicator& comm) {
  const auto can = knownCapabilities(comm, "supports_windows");
  return !can || can->deviceApi;
}

std::string noWindowReason(Communicator& comm) {
  const auto can = knownCapabilities(comm, "register_window");
  if (!can || can->deviceApi) {
    return "NCCL returned no window: windows are unsupported here";
  }
  // NCCL >= 2.29 gives a communicator symmetric memory only where its ranks
  // form one load/store team or GIN reaches every rank (init.cc).
  return c10::str(
      "NCCL returned no window: this communicator has no symmetric memory "
      "(ncclCommQueryProperties: deviceApiSupport 0, ",
      can->lsaTeams,
      " load/store teams, GIN type ",
      can->ginType,
      "); NCCL >= 2.29 registers windows between ranks that are not load/"
      "store reachable only over GPU-initiated networking (GIN), which NCCL "
      "did not bring up here (NCCL_DEBUG=INFO says why)");
}

} // namespace nccl_core

#include "nccl/errors.h"

#include "nccl/api.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <cstring>

namespace nccl_core {

const char* resultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclUnknownResult";
  }
}

namespace {
std::string describe(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line,
    const char* last) {
  std::string msg = c10::str(
      "NCCL error in ",
      call,
      " (",
      file,
      ":",
      line,
      "): ",
      resultName(result),
      " (",
      static_cast<int>(result),
      "): ",
      realNccl().getErrorString(result));
  if (last != nullptr && last[0] != '\0') {
    msg += c10::str(". Last NCCL error: ", last);
    // NCCL's bootstrap opens short-lived TCP connections for every window
    // registration; fast register/close churn runs out of local ports.
    if (std::strstr(last, "Cannot assign requested address") != nullptr) {
      msg += ". If this follows many window registrations: each one opens "
             "short-lived TCP connections that the host keeps in TIME_WAIT for "
             "a minute, so register windows once and reuse them";
    }
  }
  return msg;
}
} // namespace

void throwNcclError(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line,
    const NcclApi& api,
    ncclComm_t comm) {
  C10_THROW_ERROR(
      DistBackendError,
      describe(result, call, file, line, api.getLastError(comm)));
}

void warnNcclError(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line,
    const NcclApi& api) {
  LOG(WARNING) << "[nccl_core] "
               << describe(result, call, file, line, api.getLastError(nullptr));
}

} // namespace nccl_core

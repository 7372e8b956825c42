// The package's one check family: NCCL results and argument checks become
// torch exceptions here.
#pragma once

#include <c10/util/Exception.h>
#include <nccl.h>

#include <string>

#include "nccl/api.h"

namespace nccl_core {

// Human-readable name of an NCCL result code ("ncclUnhandledCudaError").
const char* resultName(ncclResult_t result);

// Throws c10::DistBackendError naming the failed call, where it was made, the
// NCCL status and NCCL's last error text, asked through `api`, the table the
// call was made with (shown as torch.distributed.DistBackendError in Python).
// With `comm`, NCCL's last error is that communicator's. Calls on a
// communicator go through Communicator::check, which ends here.
[[noreturn]] void throwNcclError(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line,
    const NcclApi& api,
    ncclComm_t comm = nullptr);

// For destructors and teardown paths, where throwing is not an option.
void warnNcclError(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line,
    const NcclApi& api);

} // namespace nccl_core

// A call of table `api` without a communicator to check it (a unique id, a
// query, a teardown), checked or warned about.
#define NCCL_CORE_CHECK(api, call)                                          \
  do {                                                                      \
    ncclResult_t result_ = (call);                                          \
    if (C10_UNLIKELY(result_ != ncclSuccess))                               \
      ::nccl_core::throwNcclError(result_, #call, __FILE__, __LINE__, api); \
  } while (0)

#define NCCL_CORE_WARN(api, call)                                          \
  do {                                                                     \
    ncclResult_t result_ = (call);                                         \
    if (result_ != ncclSuccess)                                            \
      ::nccl_core::warnNcclError(result_, #call, __FILE__, __LINE__, api); \
  } while (0)

// The checks of what a caller asked for, one per kind of error, each reading
// "nccl_core <op>: <message>" (`op` names the package op or setting:
// "all_reduce", "put_signal", "Options") and raised before NCCL is called, so
// a refused call leaves the group usable:
//   _ARG        ValueError: a value out of range or inconsistent
//   _ARG_TYPE   TypeError: an argument of the wrong kind
//   _SUPPORTED  NotImplementedError: what this NCCL, build or platform cannot
//               do, naming what would
//   _STATE      RuntimeError: a call in the wrong state of the group
// NCCL results go through NCCL_CORE_CHECK / NCCL_CORE_WARN above, CUDA results
// through c10's C10_CUDA_CHECK / C10_CUDA_CHECK_WARN.
#define NCCL_CORE_CHECK_ARG(cond, op, ...) \
  TORCH_CHECK_VALUE(cond, "nccl_core ", op, ": ", __VA_ARGS__)
#define NCCL_CORE_CHECK_ARG_TYPE(cond, op, ...) \
  TORCH_CHECK_TYPE(cond, "nccl_core ", op, ": ", __VA_ARGS__)
#define NCCL_CORE_CHECK_SUPPORTED(cond, op, ...) \
  TORCH_CHECK_NOT_IMPLEMENTED(cond, "nccl_core ", op, ": ", __VA_ARGS__)
#define NCCL_CORE_CHECK_STATE(cond, op, ...) \
  TORCH_CHECK(cond, "nccl_core ", op, ": ", __VA_ARGS__)

// The package's one check family: NCCL results and argument checks become
// torch exceptions here.
#pragma once

#include <c10/util/Exception.h>
#include <nccl.h>

#include <string>

namespace nccl_core {

// Human-readable name of an NCCL result code ("ncclUnhandledCudaError").
const char* resultName(ncclResult_t result);

// Throws c10::DistBackendError naming the failed call, where it was made, the
// NCCL status and NCCL's last error text (shown as torch.distributed.
// DistBackendError in Python).
[[noreturn]] void throwNcclError(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line,
    ncclComm_t comm = nullptr);

// For destructors and teardown paths, where throwing is not an option.
void warnNcclError(
    ncclResult_t result,
    const char* call,
    const char* file,
    int line);

} // namespace nccl_core

#define NCCL_CORE_CHECK(call)                                          \
  do {                                                                 \
    ncclResult_t result_ = (call);                                     \
    if (C10_UNLIKELY(result_ != ncclSuccess))                          \
      ::nccl_core::throwNcclError(result_, #call, __FILE__, __LINE__); \
  } while (0)

#define NCCL_CORE_WARN(call)                                          \
  do {                                                                \
    ncclResult_t result_ = (call);                                    \
    if (result_ != ncclSuccess)                                       \
      ::nccl_core::warnNcclError(result_, #call, __FILE__, __LINE__); \
  } while (0)

// An argument check of the package op `op` ("all_reduce", "put_signal"):
// raises ValueError (TypeError for the _TYPE form) reading
// "nccl_core <op>: <message>" before NCCL is called, so a refused call leaves
// the group usable.
#define NCCL_CORE_CHECK_ARG(cond, op, ...) \
  TORCH_CHECK_VALUE(cond, "nccl_core ", op, ": ", __VA_ARGS__)
#define NCCL_CORE_CHECK_ARG_TYPE(cond, op, ...) \
  TORCH_CHECK_TYPE(cond, "nccl_core ", op, ": ", __VA_ARGS__)

#include "nccl/communicator.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "nccl/errors.h"

namespace nccl_core {

std::shared_ptr<Communicator> Communicator::create(
    int nranks,
    int rank,
    const ncclUniqueId& id,
    int device,
    ncclConfig_t config) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ncclComm_t comm = nullptr;
  ncclResult_t result =
      ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (result != ncclSuccess) {
    throwNcclError(result, "ncclCommInitRankConfig", __FILE__, __LINE__, comm);
  }
  return std::shared_ptr<Communicator>(
      new Communicator(comm, rank, nranks, device));
}

std::shared_ptr<Communicator>
Communicator::split(int color, int key, ncclConfig_t config) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  ncclComm_t child = nullptr;
  ncclResult_t result = ncclCommSplit(
      get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  if (result != ncclSuccess) {
    throwNcclError(result, "ncclCommSplit", __FILE__, __LINE__, comm_);
  }
  if (child == nullptr) {
    return nullptr;
  }
  int childRank = 0;
  int childSize = 0;
  NCCL_CORE_CHECK(ncclCommUserRank(child, &childRank));
  NCCL_CORE_CHECK(ncclCommCount(child, &childSize));
  return std::shared_ptr<Communicator>(
      new Communicator(child, childRank, childSize, device_));
}

Communicator::Communicator(ncclComm_t comm, int rank, int size, int device)
    : comm_(comm), rank_(rank), size_(size), device_(device) {}

Communicator::~Communicator() {
  abort();
}

ncclComm_t Communicator::get() const {
  if (C10_UNLIKELY(isAborted())) {
    C10_THROW_ERROR(DistBackendError, "NCCL communicator was aborted");
  }
  return comm_;
}

void Communicator::abort() noexcept {
  // ncclCommAbort rather than ncclCommDestroy: it frees the same resources
  // but never waits for peers or for operations that may never complete.
  std::lock_guard<std::mutex> lock(abortMutex_);
  if (aborted_.exchange(true, std::memory_order_acq_rel)) {
    return;
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  NCCL_CORE_WARN(ncclCommAbort(comm_));
}

ncclResult_t Communicator::asyncError() const {
  if (isAborted()) {
    return ncclSuccess;
  }
  ncclResult_t asyncResult = ncclSuccess;
  ncclResult_t result = ncclCommGetAsyncError(comm_, &asyncResult);
  return result != ncclSuccess ? result : asyncResult;
}

} // namespace nccl_core

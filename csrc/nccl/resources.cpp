#include "nccl/resources.h"

#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"

namespace nccl_core {

CommResource::CommResource(
    std::weak_ptr<Communicator> comm,
    std::optional<uint64_t> allocation)
    : comm_(std::move(comm)), allocation_(allocation) {}

void CommResource::close() noexcept {
  if (auto comm = comm_.lock()) {
    comm->close(*this);
  } else {
    // The communicator is gone and took the NCCL handle with it.
    closed_.store(true, std::memory_order_release);
  }
}

void CommResource::requireValid() const {
  NCCL_CORE_CHECK_STATE(
      isValid(),
      kind(),
      "this ",
      kind(),
      " was closed (by close(), by freeing its memory, or by destroying or "
      "aborting its communicator)");
}

uintptr_t RegisteredBuffer::handle() const {
  requireValid();
  return reinterpret_cast<uintptr_t>(handle_);
}

void RegisteredBuffer::release(const NcclApi& api, ncclComm_t comm) noexcept {
  NCCL_CORE_WARN(api, api.commDeregister(comm, handle_));
}

ncclWindow_t Window::get() const {
  requireValid();
  return window_;
}

void* Window::userPtr() const {
  requireValid();
  return userPtr_;
}

void Window::release(const NcclApi& api, ncclComm_t comm) noexcept {
  NCCL_CORE_WARN(api, api.commWindowDeregister(comm, window_));
}

ncclRedOp_t CustomRedOp::get() const {
  requireValid();
  return op_;
}

bool CustomRedOp::ownedBy(const Communicator& comm) const {
  return communicator().get() == &comm;
}

void CustomRedOp::release(const NcclApi& api, ncclComm_t comm) noexcept {
  NCCL_CORE_WARN(api, api.redOpDestroy(op_, comm));
}

} // namespace nccl_core

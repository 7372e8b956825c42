#include "backend/routing/tensor_registration.h"

#include "backend/ops/arguments.h"
#include "nccl/allocations.h"
#include "nccl/errors.h"
#include "nccl/version.h"

namespace nccl_core {

namespace {

constexpr const char* kRegisterWindow = "register_window";
constexpr int kKnownWindowFlags =
    NCCL_WIN_COLL_SYMMETRIC | kWindowStrictOrdering;

void checkWindowFlags(int flags) {
  NCCL_CORE_CHECK_ARG(
      (flags & ~kKnownWindowFlags) == 0,
      kRegisterWindow,
      "unknown flags ",
      flags,
      "; expected a combination of WindowFlag.DEFAULT, COLL_SYMMETRIC and "
      "STRICT_ORDERING");
  NCCL_CORE_CHECK_SUPPORTED(
      (flags & kWindowStrictOrdering) == 0 ||
          hasFeature(Feature::WindowStrictOrdering),
      kRegisterWindow,
      "WindowFlag.STRICT_ORDERING needs NCCL >= 2.29 at run time");
}

// This rank's part of a window over `tensor`, checked: NCCL memory at an
// offset NCCL can map, with known flags.
WindowPart partOf(Communicator& comm, const at::Tensor& tensor, int flags) {
  checkRegistrable(comm, tensor, kRegisterWindow);
  checkWindowFlags(flags);
  const auto allocation = findAllocation(tensor.data_ptr(), tensor.nbytes());
  NCCL_CORE_CHECK_ARG(
      allocation && allocation->kind == MemoryKind::Nccl,
      kRegisterWindow,
      "the tensor must lie in NCCL memory "
      "(torch_nccl_core.empty, mem_pool, or a group's allocate_tensor); it "
      "lies in ordinary CUDA memory");
  NCCL_CORE_CHECK_ARG(
      reinterpret_cast<uintptr_t>(tensor.data_ptr()) %
              NCCL_WIN_REQUIRED_ALIGNMENT ==
          0,
      kRegisterWindow,
      "the tensor's data must be aligned to ",
      NCCL_WIN_REQUIRED_ALIGNMENT,
      " bytes (allocate it on its own, not as a view into another tensor)");
  const auto place = comm.api().windowPlace(tensor.data_ptr(), tensor.nbytes());
  NCCL_CORE_CHECK_ARG(
      place.has_value(),
      kRegisterWindow,
      "NCCL cannot map the tensor's memory for peers (not one shareable "
      "cuMem allocation)");
  return {place->allocationBytes, place->offset, tensor.nbytes(), flags};
}

} // namespace

void checkRegistrable(
    const Communicator& comm,
    const at::Tensor& tensor,
    const char* op) {
  checkTensor(
      tensor, static_cast<c10::DeviceIndex>(comm.device()), op, "tensor");
  NCCL_CORE_CHECK_ARG(tensor.nbytes() > 0, op, "the tensor is empty");
}

std::shared_ptr<Window>
registerTensorWindow(Communicator& comm, const at::Tensor& tensor, int flags) {
  NCCL_CORE_CHECK_SUPPORTED(
      hasFeature(Feature::WindowRegistration),
      kRegisterWindow,
      "windows need NCCL >= 2.27 at run time");
  // A rank that refuses its own part still joins the exchange, so that every
  // rank raises instead of waiting in NCCL for it.
  std::exception_ptr refusal;
  WindowPart mine{.flags = flags, .refused = true};
  try {
    mine = partOf(comm, tensor, flags);
  } catch (const c10::Error&) {
    refusal = std::current_exception();
  }
  WindowLayout layout = exchangeLayout(comm, mine);
  if (refusal) {
    std::rethrow_exception(refusal);
  }
  return comm.registerWindow(
      tensor.data_ptr(), tensor.nbytes(), flags, std::move(layout));
}

} // namespace nccl_core

#include "backend/routing/tensor_registration.h"

#include "backend/ops/arguments.h"
#include "nccl/allocations.h"
#include "nccl/errors.h"
#include "nccl/one_sided.h"
#include "nccl/version.h"

namespace nccl_core {

namespace {

constexpr int kKnownWindowFlags =
    NCCL_WIN_COLL_SYMMETRIC | kWindowStrictOrdering;

void checkWindowFlags(int flags) {
  NCCL_CORE_CHECK_ARG(
      (flags & ~kKnownWindowFlags) == 0,
      "register_window",
      "unknown flags ",
      flags,
      "; expected a combination of WindowFlag.DEFAULT, COLL_SYMMETRIC and "
      "STRICT_ORDERING");
  NCCL_CORE_CHECK_SUPPORTED(
      (flags & kWindowStrictOrdering) == 0 ||
          hasFeature(Feature::WindowStrictOrdering),
      "register_window",
      "WindowFlag.STRICT_ORDERING needs NCCL >= 2.29 at run time");
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
  constexpr const char* kOp = "register_window";
  NCCL_CORE_CHECK_SUPPORTED(
      hasFeature(Feature::WindowRegistration),
      kOp,
      "windows need NCCL >= 2.27 at run time");
  checkRegistrable(comm, tensor, kOp);
  checkWindowFlags(flags);
  const auto allocation = findAllocation(tensor.data_ptr(), tensor.nbytes());
  NCCL_CORE_CHECK_ARG(
      allocation && allocation->kind == MemoryKind::Nccl,
      kOp,
      "the tensor must lie in NCCL memory "
      "(torch_nccl_core.empty, mem_pool, or a group's allocate_tensor); it "
      "lies in ordinary CUDA memory");
  NCCL_CORE_CHECK_ARG(
      reinterpret_cast<uintptr_t>(tensor.data_ptr()) %
              NCCL_WIN_REQUIRED_ALIGNMENT ==
          0,
      kOp,
      "the tensor's data must be aligned to ",
      NCCL_WIN_REQUIRED_ALIGNMENT,
      " bytes (allocate it on its own, not as a view into another tensor)");
  auto window = comm.registerWindow(tensor.data_ptr(), tensor.nbytes(), flags);
  if (window) {
    // Ranks may register different sizes: put_signal checks the target's.
    recordWindowSizes(comm, window);
  }
  return window;
}

} // namespace nccl_core

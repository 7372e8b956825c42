#include "backend/ops/nan_check.h"

#include <c10/util/env.h>

#include "nccl/errors.h"

namespace nccl_core {

bool nanCheckRequested() {
  return c10::utils::check_env("TORCH_NCCL_NAN_CHECK").value_or(false);
}

void refuseNan(const char* op, const std::vector<at::Tensor>& sent) {
  // One flag per tensor, read back together: one synchronization per op.
  std::vector<at::Tensor> flags;
  std::vector<size_t> index;
  for (size_t i = 0; i < sent.size(); ++i) {
    const at::Tensor& tensor = sent[i];
    const at::ScalarType type = tensor.scalar_type();
    // FP4 (e2m1) has no NaN.
    if ((!at::isFloatingType(type) && !at::isComplexType(type)) ||
        type == at::ScalarType::Float4_e2m1fn_x2) {
      continue;
    }
    // isnan has no kernel for every reduced-precision type: compare as float.
    const at::Tensor values =
        at::isFloat8Type(type) ? tensor.to(at::kFloat) : tensor;
    flags.push_back(at::isnan(values).any().reshape({1}));
    index.push_back(i);
  }
  if (flags.empty()) {
    return;
  }
  const at::Tensor found = at::cat(flags).cpu();
  const bool* any = found.data_ptr<bool>();
  for (size_t k = 0; k < index.size(); ++k) {
    NCCL_CORE_CHECK_ARG(
        !any[k],
        op,
        "tensor ",
        index[k],
        " to send holds NaN (TORCH_NCCL_NAN_CHECK=1 refuses such ops)");
  }
}

} // namespace nccl_core

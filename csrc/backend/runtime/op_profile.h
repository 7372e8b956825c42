// An op as torch.profiler and the autograd profiler show it, recorded the way
// ProcessGroupNCCL records its ops: a "nccl_core:<op>" range (torch's name of
// the op, torch_op_names.h) around the enqueue with the op's tensors (so its
// kernels correlate to it on the CUDA timeline), an async event as the ranges
// of torch's Work are, and torch's record_param_comms event carrying the
// sequence number, group, element counts and dtype. Costs one thread-local
// check when no profiler is on.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <string>
#include <vector>

#include "backend/runtime/work.h"

namespace nccl_core {

class OpProfile {
 public:
  OpProfile(
      const OpInfo& info,
      const std::string& group,
      int rank,
      int size,
      int peer, // send and recv: the other rank
      const std::vector<at::Tensor>& inputs,
      const std::vector<at::Tensor>& outputs);
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

 private:
  // Declared first: the range holds a view of it until it ends.
  std::string title_;
  at::RecordFunction range_{at::RecordScope::USER_SCOPE};
};

} // namespace nccl_core

// TORCH_NCCL_NAN_CHECK=1, the switch ProcessGroupNCCL reads: an op whose data
// to send holds a NaN is refused. ProcessGroupNCCL checks in a kernel that
// traps, so the process loses its CUDA context; this checks on the host, one
// synchronization per op (a debugging switch), so that the op raises ValueError
// on this rank, which can go on. Ranks that did not refuse the op wait for it
// until the group's timeout. Torch >= 2.14 also has a backend-agnostic hook
// (TORCH_DIST_NAN_CHECK), which works on nccl_core as on any backend.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace nccl_core {

// Whether TORCH_NCCL_NAN_CHECK asks for the check (read when a group is made).
bool nanCheckRequested();

// Raises ValueError naming `op` and the tensor if a floating-point tensor of
// `sent` holds a NaN. Synchronizes with the current stream: not for use
// while it captures a CUDA graph.
void refuseNan(const char* op, const std::vector<at::Tensor>& sent);

} // namespace nccl_core

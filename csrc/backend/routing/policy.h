// Registration and routing policy, from measurements (docs/memory.md), which
// CommRoutes applies. On a collective whose buffers lie in a symmetric
// window NCCL picks its symmetric kernels, which on 2 GPUs over NVLink
// without multicast lose to its ring kernels for some ops and sizes; those
// run on the group's window-free twin communicator instead, where the same
// memory is buffer-registered (zero-copy), so a window never makes an op
// slower than plain registration.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstddef>

namespace nccl_core {

// TORCH_NCCL_CORE_SYMMETRIC_KERNELS: "auto" (default: by the measured table),
// "always" (leave every op to NCCL's choice) or "never" (no symmetric
// kernels on window memory).
enum class SymmetricKernels { Auto, Always, Never };
SymmetricKernels symmetricKernelsSetting();

// Whether symmetric kernels beat the ring for `type` at `bytes` (docs/memory.md
// has the measurements behind the table).
bool symmetricKernelsWin(c10d::OpType type, size_t bytes);

// Whether an op of `type` on NCCL memory should register that memory on first
// use. Broadcast is the exception: NCCL's registered broadcast measured 3-8%
// slower than the copy-through one at 8-32 MiB (docs/memory.md); on window
// memory it is routed to the twin, where nothing is registered.
bool registrationGains(c10d::OpType type);

} // namespace nccl_core

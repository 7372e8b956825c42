// Tensors registered with a communicator, checked first: the one way
// torch_nccl_core's register_buffer / register_window and torch's Window API
// (backend/ops/windows.h) register them.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "nccl/communicator.h"

namespace nccl_core {

// A tensor `comm` can register: CUDA, dense, on its device, not empty.
// ValueError naming `op` otherwise.
void checkRegistrable(
    const Communicator& comm,
    const at::Tensor& tensor,
    const char* op);

// Registers `tensor` as a window of `comm` with NCCL window `flags`, every
// rank's part exchanged first (window_layout.h). Collective. Refuses, on
// every rank alike and before NCCL is asked, memory that is not NCCL memory,
// a misaligned start, unknown flags and parts NCCL would address wrongly
// (ValueError: a rank's own refusal on that rank, "rank N refused its part"
// on the others), and an NCCL without windows or the flags' feature
// (NotImplementedError). Null where NCCL returned no window.
std::shared_ptr<Window>
registerTensorWindow(Communicator& comm, const at::Tensor& tensor, int flags);

// NCCL_WIN_STRICT_ORDERING, defined from NCCL 2.29 on.
constexpr int kWindowStrictOrdering = 0x2;

} // namespace nccl_core

// The argument checks every op shares, and a tensor as NCCL sees it. Checks
// raise ValueError / TypeError (NCCL_CORE_CHECK_ARG) before NCCL is called, so
// a bad call leaves the communicator usable.
#pragma once

#include <ATen/ATen.h>
#include <nccl.h>

#include <vector>

namespace nccl_core {

class Communicator;
class Window;
struct PutSignal; // nccl/one_sided.h

// A tensor as NCCL sees it: complex tensors travel as twice as many reals.
struct NcclBuffer {
  void* ptr;
  size_t count;
  ncclDataType_t dtype;
};

NcclBuffer bufferOf(const at::Tensor& tensor, const char* op);

// Defined and on a CUDA device; `what` names the argument.
void checkCuda(const at::Tensor& tensor, const char* op, const char* what);

// CUDA, dense, contiguous and on `device`; `what` names the argument.
void checkTensor(
    const at::Tensor& tensor,
    c10::DeviceIndex device,
    const char* op,
    const char* what);

// The one tensor of a list argument that must hold exactly one.
const at::Tensor& singleTensor(
    const std::vector<at::Tensor>& tensors,
    const char* op,
    const char* what);

// The output of an op that reads `input`: checked as checkTensor does, and of
// the input's dtype.
void checkOutput(
    const at::Tensor& output,
    const at::Tensor& input,
    c10::DeviceIndex device,
    const char* op);

// One entry per rank in `list` (e.g. all_gather outputs), each checked and on
// the device and of the dtype of `like` (the op's tensor on this rank).
void checkPerRankList(
    const std::vector<at::Tensor>& list,
    int worldSize,
    const at::Tensor& like,
    const char* op,
    const char* what);

void checkRank(int64_t rank, int worldSize, const char* op, const char* what);

// Per-rank element counts of one side of all_to_all_single (`what`: "input"
// or "output"): `splits` rows of dim 0 each, or equal parts without splits.
std::vector<int64_t> allToAllCounts(
    const at::Tensor& tensor,
    const std::vector<int64_t>& splits,
    int worldSize,
    const char* what);

// The CUDA device of `comm`, as c10 numbers it.
c10::DeviceIndex deviceOf(const Communicator& comm);

// A coalesced op's lists: one output per input, at least one.
void checkPaired(
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    const char* op);

// Where a put lands: rank `peer`'s part of `window`, `offset` elements of the
// source's dtype in.
struct PutTarget {
  const Window& window;
  int64_t peer;
  int64_t offset;
};

// put_signal's arguments, checked: `to.window` open and `comm`'s, `to.peer`
// another rank of `comm`'s group, `src` a CUDA tensor on its device that fits
// the target's part of the window where `to` says.
PutSignal checkedPutSignal(
    const Communicator& comm,
    const at::Tensor& src,
    const PutTarget& to,
    const char* op);

} // namespace nccl_core

#include "backend/ops/arguments.h"

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include "nccl/communicator.h"
#include "nccl/dtypes.h"
#include "nccl/errors.h"
#include "nccl/one_sided.h"
#include "nccl/resources.h"

namespace nccl_core {

namespace {
// Where `src` lands `offset` elements into `peer`'s part of `window` (in
// bytes), with room for all of it; computed without overflow.
size_t
checkedOffsetBytes(const at::Tensor& src, const PutTarget& to, const char* op) {
  const size_t bytes = src.nbytes();
  const size_t windowBytes = to.window.part(static_cast<int>(to.peer)).bytes;
  NCCL_CORE_CHECK_ARG(
      to.offset >= 0 && bytes <= windowBytes &&
          static_cast<uint64_t>(to.offset) <=
              (windowBytes - bytes) / src.element_size(),
      op,
      bytes,
      " bytes at element offset ",
      to.offset,
      " do not fit in the window (",
      windowBytes,
      " bytes at rank ",
      to.peer,
      "); expected 0 <= offset and offset * element size + bytes <= "
      "window size");
  return static_cast<size_t>(to.offset) * src.element_size();
}
constexpr const char* kAllToAll = "alltoall_base";

// Per-rank element counts of an all-to-all side without splits: equal parts.
std::vector<int64_t>
evenCounts(const at::Tensor& tensor, int worldSize, const char* what) {
  NCCL_CORE_CHECK_ARG(
      tensor.numel() % worldSize == 0,
      kAllToAll,
      what,
      " has ",
      tensor.numel(),
      " elements, not divisible by the world size ",
      worldSize);
  return std::vector<int64_t>(worldSize, tensor.numel() / worldSize);
}

} // namespace

NcclBuffer bufferOf(const at::Tensor& tensor, const char* op) {
  const auto element = ncclElementType(tensor.scalar_type());
  NCCL_CORE_CHECK_ARG_TYPE(
      element.has_value(),
      op,
      "dtype ",
      tensor.scalar_type(),
      " is not supported; expected one of ",
      kSupportedDtypes);
  return {
      tensor.data_ptr(),
      static_cast<size_t>(tensor.numel()) * element->perElement,
      element->dtype};
}

void checkCuda(const at::Tensor& tensor, const char* op, const char* what) {
  NCCL_CORE_CHECK_ARG(tensor.defined(), op, what, " is an undefined tensor");
  NCCL_CORE_CHECK_ARG(
      tensor.is_cuda(),
      op,
      what,
      " must be a CUDA tensor, got one on ",
      tensor.device());
}

void checkTensor(
    const at::Tensor& tensor,
    c10::DeviceIndex device,
    const char* op,
    const char* what) {
  checkCuda(tensor, op, what);
  NCCL_CORE_CHECK_ARG(
      tensor.layout() == at::kStrided,
      op,
      what,
      " must be dense (strided), got layout ",
      tensor.layout());
  NCCL_CORE_CHECK_ARG(
      tensor.device().index() == device,
      op,
      what,
      " is on ",
      tensor.device(),
      " but this process group's communicator uses cuda:",
      static_cast<int>(device));
  NCCL_CORE_CHECK_ARG(
      tensor.is_contiguous(),
      op,
      what,
      " must be contiguous, got sizes ",
      tensor.sizes(),
      " and strides ",
      tensor.strides(),
      " (call .contiguous() first)");
}

const at::Tensor& singleTensor(
    const std::vector<at::Tensor>& tensors,
    const char* op,
    const char* what) {
  NCCL_CORE_CHECK_ARG(
      tensors.size() == 1,
      op,
      "expected exactly one ",
      what,
      " tensor, got ",
      tensors.size());
  return tensors[0];
}

void checkOutput(
    const at::Tensor& output,
    const at::Tensor& input,
    c10::DeviceIndex device,
    const char* op) {
  checkTensor(output, device, op, "output");
  NCCL_CORE_CHECK_ARG_TYPE(
      input.scalar_type() == output.scalar_type(),
      op,
      "input and output dtypes differ (",
      input.scalar_type(),
      " vs ",
      output.scalar_type(),
      ")");
}

void checkPaired(
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    const char* op) {
  NCCL_CORE_CHECK_ARG(
      !inputs.empty() && inputs.size() == outputs.size(),
      op,
      "expected as many outputs as inputs (at least one), got ",
      outputs.size(),
      " and ",
      inputs.size());
}

void checkPerRankList(
    const std::vector<at::Tensor>& list,
    int worldSize,
    const at::Tensor& like,
    const char* op,
    const char* what) {
  const at::ScalarType dtype = like.scalar_type();
  const c10::DeviceIndex device = like.device().index();
  NCCL_CORE_CHECK_ARG(
      static_cast<int>(list.size()) == worldSize,
      op,
      what,
      " must hold one tensor per rank (",
      worldSize,
      "), got ",
      list.size());
  for (const auto& tensor : list) {
    checkTensor(tensor, device, op, what);
    NCCL_CORE_CHECK_ARG_TYPE(
        tensor.scalar_type() == dtype,
        op,
        what,
        " has dtype ",
        tensor.scalar_type(),
        " but the input is ",
        dtype);
  }
}

void checkRank(int64_t rank, int worldSize, const char* op, const char* what) {
  NCCL_CORE_CHECK_ARG(
      rank >= 0 && rank < worldSize,
      op,
      what,
      " ",
      rank,
      " is out of range; expected 0 <= ",
      what,
      " < ",
      worldSize);
}

PutSignal checkedPutSignal(
    const Communicator& comm,
    const at::Tensor& src,
    const PutTarget& to,
    const char* op) {
  to.window.get(); // RuntimeError once closed
  // Before the target's part is read: the window's ranks are its group's.
  NCCL_CORE_CHECK_ARG(
      to.window.communicator().get() == &comm,
      op,
      "the window belongs to another communicator; use the communicator of "
      "the group that registered it");
  checkPeer(comm, to.peer, op);
  checkTensor(src, static_cast<c10::DeviceIndex>(comm.device()), op, "src");
  const NcclBuffer buf = bufferOf(src, op);
  return PutSignal{
      buf.ptr,
      buf.count,
      buf.dtype,
      src.nbytes(),
      static_cast<int>(to.peer),
      to.window,
      checkedOffsetBytes(src, to, op)};
}

std::vector<int64_t> allToAllCounts(
    const at::Tensor& tensor,
    const std::vector<int64_t>& splits,
    int worldSize,
    const char* what) {
  if (splits.empty()) {
    return evenCounts(tensor, worldSize, what);
  }
  NCCL_CORE_CHECK_ARG(
      tensor.dim() >= 1, kAllToAll, what, " splits need a dim 0");
  const int64_t rows = tensor.size(0);
  const int64_t rowElems = rows == 0 ? 0 : tensor.numel() / rows;
  std::vector<int64_t> counts(worldSize);
  NCCL_CORE_CHECK_ARG(
      static_cast<int>(splits.size()) == worldSize,
      kAllToAll,
      "expected one ",
      what,
      " split per rank (",
      worldSize,
      "), got ",
      splits.size());
  int64_t total = 0;
  for (int r = 0; r < worldSize; ++r) {
    NCCL_CORE_CHECK_ARG(
        splits[r] >= 0,
        kAllToAll,
        what,
        " splits must be >= 0, got ",
        splits[r]);
    // Overflow-checked: a split near INT64_MAX must not wrap into a sum
    // that matches dim 0.
    NCCL_CORE_CHECK_ARG(
        !c10::add_overflows(total, splits[r], &total) &&
            !c10::mul_overflows(splits[r], rowElems, &counts[r]),
        kAllToAll,
        what,
        " splits overflow int64 (split ",
        r,
        " is ",
        splits[r],
        ")");
  }
  NCCL_CORE_CHECK_ARG(
      total == rows,
      kAllToAll,
      what,
      " splits sum to ",
      total,
      " but dim 0 of the ",
      what,
      " is ",
      rows);
  return counts;
}

c10::DeviceIndex deviceOf(const Communicator& comm) {
  return static_cast<c10::DeviceIndex>(comm.device());
}

} // namespace nccl_core

// Steps every op shares: argument checks, dtype and reduce-op mapping.
// Checks raise ValueError / TypeError before NCCL is called, so a bad call
// leaves the communicator usable.
#pragma once

#include <ATen/ATen.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>
#include <vector>

#include "nccl/communicator.h"

namespace nccl_core {

// A tensor as NCCL sees it: complex tensors travel as twice as many reals.
struct NcclBuffer {
  void* ptr;
  size_t count;
  ncclDataType_t dtype;
};

NcclBuffer bufferOf(const at::Tensor& tensor, const char* op);

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

void checkSameDtype(const at::Tensor& a, const at::Tensor& b, const char* op);

// One entry per rank in `list` (e.g. all_gather outputs), each checked and of
// `dtype`.
void checkPerRankList(
    const std::vector<at::Tensor>& list,
    int worldSize,
    c10::DeviceIndex device,
    at::ScalarType dtype,
    const char* op,
    const char* what);

void checkRank(int64_t rank, int worldSize, const char* op, const char* what);

// A reduce op for one tensor's dtype. PREMUL_SUM creates an NCCL custom op
// that lives as long as this object; NCCL allows destroying it as soon as the
// operations using it are enqueued.
// The supplement of a torch ReduceOp made by Communicator.create_pre_mul_sum:
// it carries the communicator's own NCCL op.
struct CustomRedOpSupplement : c10d::_SupplementBase {
  explicit CustomRedOpSupplement(std::shared_ptr<CustomRedOp> op)
      : op(std::move(op)) {}
  std::shared_ptr<CustomRedOp> op;
};

class ReduceOp {
 public:
  ReduceOp(
      const c10d::ReduceOp& op,
      const at::Tensor& tensor,
      Communicator& comm,
      const char* opName);
  ReduceOp(const ReduceOp&) = delete;
  ReduceOp& operator=(const ReduceOp&) = delete;
  ~ReduceOp();

  ncclRedOp_t get() const {
    return op_;
  }
  // An NCCL built-in op (valid on any communicator).
  bool isBuiltin() const {
    return builtin_;
  }
  // The device-resident factor of a PREMUL_SUM with a tensor factor; the
  // operation must keep it alive until it has run.
  const at::Tensor& factor() const {
    return factor_;
  }

 private:
  void useCustom(
      const CustomRedOp& custom,
      const at::Tensor& tensor,
      const Communicator& comm,
      const char* opName);

  ncclRedOp_t op_;
  Communicator* comm_ = nullptr; // set when op_ is a custom op to destroy
  bool builtin_ = true;
  at::Tensor factor_;
};

} // namespace nccl_core

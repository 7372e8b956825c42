// torch reduce ops -> NCCL reduce ops, per dtype, custom ops included.
#pragma once

#include <ATen/ATen.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>

#include "nccl/communicator.h"

namespace nccl_core {

// The supplement of a torch ReduceOp made by Communicator.create_pre_mul_sum:
// it carries the communicator's own NCCL op.
struct CustomRedOpSupplement : c10d::_SupplementBase {
  explicit CustomRedOpSupplement(std::shared_ptr<CustomRedOp> op)
      : op(std::move(op)) {}
  std::shared_ptr<CustomRedOp> op;
};

// The NCCL reduce op for a c10d::ReduceOp on one tensor's dtype. PREMUL_SUM
// creates an NCCL custom op that lives as long as this object; NCCL allows
// destroying it as soon as the operations using it are enqueued.
class NcclReduceOp {
 public:
  NcclReduceOp(
      const c10d::ReduceOp& op,
      const at::Tensor& tensor,
      Communicator& comm,
      const char* opName);
  NcclReduceOp(const NcclReduceOp&) = delete;
  NcclReduceOp& operator=(const NcclReduceOp&) = delete;
  ~NcclReduceOp();

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
  // PREMUL_SUM: the op's own custom op, or one made for its factor.
  void usePreMulSum(
      const c10d::ReduceOp& op,
      const at::Tensor& tensor,
      Communicator& comm,
      const char* opName);

  ncclRedOp_t op_;
  Communicator* comm_ = nullptr; // set when op_ is a custom op to destroy
  bool builtin_ = true;
  at::Tensor factor_;
};

} // namespace nccl_core

#include "backend/ops/reduce_op.h"

#include <array>

#include <c10/util/Exception.h>

#include "backend/ops/arguments.h"
#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

// c10d::ReduceOp::RedOpType's names, in the order of its values (0 to UNUSED).
// clang-format off
constexpr std::array<const char*, c10d::ReduceOp::UNUSED + 1> kRedOpNames{
    "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM",
    "UNUSED"};
// clang-format on
static_assert(
    c10d::ReduceOp::SUM == 0 && c10d::ReduceOp::AVG == 1 &&
    c10d::ReduceOp::PRODUCT == 2 && c10d::ReduceOp::MIN == 3 &&
    c10d::ReduceOp::MAX == 4 && c10d::ReduceOp::BAND == 5 &&
    c10d::ReduceOp::BOR == 6 && c10d::ReduceOp::BXOR == 7 &&
    c10d::ReduceOp::PREMUL_SUM == 8 && c10d::ReduceOp::UNUSED == 9);

const char* redOpName(c10d::ReduceOp::RedOpType op) {
  return op < kRedOpNames.size() ? kRedOpNames[op] : "UNUSED";
}

bool isFloating(at::ScalarType type) {
  return at::isFloatingType(type) || at::isComplexType(type);
}

} // namespace

NcclReduceOp::NcclReduceOp(
    const c10d::ReduceOp& op,
    const at::Tensor& tensor,
    Communicator& comm,
    const char* opName) {
  const at::ScalarType type = tensor.scalar_type();
  const bool isBool = type == at::kBool;
  const bool isComplex = at::isComplexType(type);
  auto refuse = [&](const char* reason) {
    NCCL_CORE_CHECK_ARG_TYPE(
        false,
        opName,
        "reduce op ",
        redOpName(op.op_),
        " is not supported for dtype ",
        type,
        reason);
  };
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      op_ = isBool ? ncclMax : ncclSum; // logical or
      break;
    case c10d::ReduceOp::PRODUCT:
      if (isComplex) {
        refuse(
            " (complex values are reduced as independent reals, which is exact "
            "only for SUM and AVG)");
      }
      op_ = isBool ? ncclMin : ncclProd; // logical and
      break;
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      if (isComplex) {
        refuse(" (complex numbers are not ordered)");
      }
      op_ = op.op_ == c10d::ReduceOp::MIN ? ncclMin : ncclMax;
      break;
    case c10d::ReduceOp::AVG:
      if (!isFloating(type)) {
        refuse(" (AVG needs a floating-point or complex dtype)");
      }
      op_ = ncclAvg;
      break;
    case c10d::ReduceOp::PREMUL_SUM:
      if (!isFloating(type)) {
        refuse(" (PREMUL_SUM needs a floating-point or complex dtype)");
      }
      builtin_ = false;
      usePreMulSum(op, tensor, comm, opName);
      break;
    default:
      NCCL_CORE_CHECK_ARG(
          false,
          opName,
          "reduce op ",
          redOpName(op.op_),
          " is not supported by NCCL; expected SUM, PRODUCT, MIN, MAX, AVG or "
          "PREMUL_SUM");
  }
}

void NcclReduceOp::usePreMulSum(
    const c10d::ReduceOp& op,
    const at::Tensor& tensor,
    Communicator& comm,
    const char* opName) {
  if (const auto* custom =
          dynamic_cast<CustomRedOpSupplement*>(op.supplement_.get())) {
    useCustom(*custom->op, tensor, comm, opName);
    return;
  }
  const auto* premul =
      dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  NCCL_CORE_CHECK_ARG(premul != nullptr, opName, "PREMUL_SUM without a factor");
  const at::ScalarType real = c10::toRealValueType(tensor.scalar_type());
  // The factor lives on the device in the reduced dtype: NCCL reads it when
  // the kernel runs, which also makes the op safe to capture in a graph.
  factor_ =
      premul->tensor_factor.defined()
          ? premul->tensor_factor.to(tensor.device(), real).reshape({1})
          : at::full({1}, premul->double_factor, tensor.options().dtype(real));
  const Communicator::Use use = comm.use();
  comm.check(
      comm.api().redOpCreatePreMulSum(
          &op_,
          factor_.data_ptr(),
          bufferOf(factor_, opName).dtype,
          ncclScalarDevice,
          use.handle()),
      "ncclRedOpCreatePreMulSum");
  comm_ = &comm;
}

void NcclReduceOp::useCustom(
    const CustomRedOp& custom,
    const at::Tensor& tensor,
    const Communicator& comm,
    const char* opName) {
  NCCL_CORE_CHECK_ARG(
      custom.ownedBy(comm),
      opName,
      "this custom reduce op belongs to another group's communicator; "
      "create it with the communicator of the group the op runs on");
  const ncclDataType_t dtype = bufferOf(tensor, opName).dtype;
  NCCL_CORE_CHECK_ARG_TYPE(
      custom.dtype() == dtype,
      opName,
      "the custom reduce op was created for NCCL dtype ",
      static_cast<int>(custom.dtype()),
      " but the tensor has dtype ",
      tensor.scalar_type());
  op_ = custom.get();
}

NcclReduceOp::~NcclReduceOp() {
  if (comm_ != nullptr) {
    comm_->destroyRedOp(op_);
  }
}

} // namespace nccl_core

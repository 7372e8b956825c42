#include "backend/dispatch.h"

#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/dtypes.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

const char* redOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

bool isFloating(at::ScalarType type) {
  return at::isFloatingType(type) || at::isComplexType(type);
}

} // namespace

NcclBuffer bufferOf(const at::Tensor& tensor, const char* op) {
  const auto element = ncclElementType(tensor.scalar_type());
  TORCH_CHECK_TYPE(
      element.has_value(),
      "nccl_core ",
      op,
      ": dtype ",
      tensor.scalar_type(),
      " is not supported; expected one of ",
      kSupportedDtypes);
  return {
      tensor.data_ptr(),
      static_cast<size_t>(tensor.numel()) * element->perElement,
      element->dtype};
}

void checkTensor(
    const at::Tensor& tensor,
    c10::DeviceIndex device,
    const char* op,
    const char* what) {
  TORCH_CHECK_VALUE(
      tensor.defined(),
      "nccl_core ",
      op,
      ": ",
      what,
      " is an undefined tensor");
  TORCH_CHECK_VALUE(
      tensor.is_cuda(),
      "nccl_core ",
      op,
      ": ",
      what,
      " must be a CUDA tensor, got one on ",
      tensor.device());
  TORCH_CHECK_VALUE(
      tensor.layout() == at::kStrided,
      "nccl_core ",
      op,
      ": ",
      what,
      " must be dense (strided), got layout ",
      tensor.layout());
  TORCH_CHECK_VALUE(
      tensor.device().index() == device,
      "nccl_core ",
      op,
      ": ",
      what,
      " is on ",
      tensor.device(),
      " but this process group's communicator uses cuda:",
      static_cast<int>(device));
  TORCH_CHECK_VALUE(
      tensor.is_contiguous(),
      "nccl_core ",
      op,
      ": ",
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
  TORCH_CHECK_VALUE(
      tensors.size() == 1,
      "nccl_core ",
      op,
      ": expected exactly one ",
      what,
      " tensor, got ",
      tensors.size());
  return tensors[0];
}

void checkSameDtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK_TYPE(
      a.scalar_type() == b.scalar_type(),
      "nccl_core ",
      op,
      ": input and output dtypes differ (",
      a.scalar_type(),
      " vs ",
      b.scalar_type(),
      ")");
}

void checkPerRankList(
    const std::vector<at::Tensor>& list,
    int worldSize,
    c10::DeviceIndex device,
    at::ScalarType dtype,
    const char* op,
    const char* what) {
  TORCH_CHECK_VALUE(
      static_cast<int>(list.size()) == worldSize,
      "nccl_core ",
      op,
      ": ",
      what,
      " must hold one tensor per rank (",
      worldSize,
      "), got ",
      list.size());
  for (const auto& tensor : list) {
    checkTensor(tensor, device, op, what);
    TORCH_CHECK_TYPE(
        tensor.scalar_type() == dtype,
        "nccl_core ",
        op,
        ": ",
        what,
        " has dtype ",
        tensor.scalar_type(),
        " but the input is ",
        dtype);
  }
}

void checkRank(int64_t rank, int worldSize, const char* op, const char* what) {
  TORCH_CHECK_VALUE(
      rank >= 0 && rank < worldSize,
      "nccl_core ",
      op,
      ": ",
      what,
      " ",
      rank,
      " is out of range; expected 0 <= ",
      what,
      " < ",
      worldSize);
}

ReduceOp::ReduceOp(
    const c10d::ReduceOp& op,
    const at::Tensor& tensor,
    Communicator& comm,
    const char* opName) {
  const at::ScalarType type = tensor.scalar_type();
  const bool isBool = type == at::kBool;
  const bool isComplex = at::isComplexType(type);
  auto refuse = [&](const char* reason) {
    TORCH_CHECK_TYPE(
        false,
        "nccl_core ",
        opName,
        ": reduce op ",
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
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!isFloating(type)) {
        refuse(" (PREMUL_SUM needs a floating-point or complex dtype)");
      }
      builtin_ = false;
      if (const auto* custom =
              dynamic_cast<CustomRedOpSupplement*>(op.supplement_.get())) {
        useCustom(*custom->op, tensor, comm, opName);
        break;
      }
      const auto* premul =
          dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK_VALUE(
          premul != nullptr,
          "nccl_core ",
          opName,
          ": PREMUL_SUM without a factor");
      const at::ScalarType real = c10::toRealValueType(type);
      // The factor lives on the device in the reduced dtype: NCCL reads it when
      // the kernel runs, which also makes the op safe to capture in a graph.
      factor_ =
          premul->tensor_factor.defined()
              ? premul->tensor_factor.to(tensor.device(), real).reshape({1})
              : at::full(
                    {1}, premul->double_factor, tensor.options().dtype(real));
      NCCL_CORE_CHECK(
          nccl().redOpCreatePreMulSum(
              &op_,
              factor_.data_ptr(),
              bufferOf(factor_, opName).dtype,
              ncclScalarDevice,
              comm.get()));
      comm_ = &comm;
      break;
    }
    default:
      TORCH_CHECK_VALUE(
          false,
          "nccl_core ",
          opName,
          ": reduce op ",
          redOpName(op.op_),
          " is not supported by NCCL; expected SUM, PRODUCT, MIN, MAX, AVG or "
          "PREMUL_SUM");
  }
}

void ReduceOp::useCustom(
    const CustomRedOp& custom,
    const at::Tensor& tensor,
    const Communicator& comm,
    const char* opName) {
  TORCH_CHECK_VALUE(
      custom.ownedBy(comm),
      "nccl_core ",
      opName,
      ": this custom reduce op belongs to another group's communicator; "
      "create it with the communicator of the group the op runs on");
  const ncclDataType_t dtype = bufferOf(tensor, opName).dtype;
  TORCH_CHECK_TYPE(
      custom.dtype() == dtype,
      "nccl_core ",
      opName,
      ": the custom reduce op was created for NCCL dtype ",
      static_cast<int>(custom.dtype()),
      " but the tensor has dtype ",
      tensor.scalar_type());
  op_ = custom.get();
}

ReduceOp::~ReduceOp() {
  if (comm_ != nullptr) {
    comm_->destroyRedOp(op_);
  }
}

} // namespace nccl_core

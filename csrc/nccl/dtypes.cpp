#include "nccl/dtypes.h"

namespace nccl_core {

std::optional<NcclElementType> ncclElementType(at::ScalarType type) {
  if (at::isComplexType(type)) {
    auto real = ncclElementType(c10::toRealValueType(type));
    return real ? std::optional<NcclElementType>({real->dtype, 2})
                : std::nullopt;
  }
  switch (type) {
    case at::kChar:
      return NcclElementType{ncclInt8, 1};
    case at::kByte:
    case at::kBool: // one byte; the backend reduces it with MIN / MAX
      return NcclElementType{ncclUint8, 1};
    case at::kInt:
      return NcclElementType{ncclInt32, 1};
    case at::kUInt32:
      return NcclElementType{ncclUint32, 1};
    case at::kLong:
      return NcclElementType{ncclInt64, 1};
    case at::kUInt64:
      return NcclElementType{ncclUint64, 1};
    case at::kHalf:
      return NcclElementType{ncclFloat16, 1};
    case at::kBFloat16:
      return NcclElementType{ncclBfloat16, 1};
    case at::kFloat:
      return NcclElementType{ncclFloat32, 1};
    case at::kDouble:
      return NcclElementType{ncclFloat64, 1};
    case at::kFloat8_e4m3fn:
      return NcclElementType{ncclFloat8e4m3, 1};
    case at::kFloat8_e5m2:
      return NcclElementType{ncclFloat8e5m2, 1};
    default:
      return std::nullopt;
  }
}

} // namespace nccl_core

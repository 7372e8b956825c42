#include "nccl/dtypes.h"

#include <utility>

namespace nccl_core {

namespace {

// Each real dtype NCCL carries, with its NCCL type. bool is one byte; the
// backend reduces it with MIN / MAX.
// clang-format off
constexpr std::pair<at::ScalarType, ncclDataType_t> kRealTypes[] = {
    {at::kChar, ncclInt8}, {at::kByte, ncclUint8}, {at::kBool, ncclUint8},
    {at::kInt, ncclInt32}, {at::kUInt32, ncclUint32}, {at::kLong, ncclInt64},
    {at::kUInt64, ncclUint64}, {at::kHalf, ncclFloat16},
    {at::kBFloat16, ncclBfloat16}, {at::kFloat, ncclFloat32},
    {at::kDouble, ncclFloat64}, {at::kFloat8_e4m3fn, ncclFloat8e4m3},
    {at::kFloat8_e5m2, ncclFloat8e5m2}};
// clang-format on

} // namespace

std::optional<NcclElementType> ncclElementType(at::ScalarType type) {
  if (at::isComplexType(type)) {
    auto real = ncclElementType(c10::toRealValueType(type));
    return real ? std::optional<NcclElementType>({real->dtype, 2})
                : std::nullopt;
  }
  for (const auto& [torchType, ncclType] : kRealTypes) {
    if (torchType == type) {
      return NcclElementType{ncclType, 1};
    }
  }
  return std::nullopt;
}

} // namespace nccl_core

#include "nccl/dtypes.h"

#include <array>
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

constexpr auto kScalarTypes = static_cast<size_t>(at::ScalarType::NumOptions);

// kRealTypes indexed by dtype (-1: NCCL cannot carry it), made at compile
// time: every op's buffer check looks its dtype up once.
constexpr std::array<int, kScalarTypes> kNcclTypeOf = [] {
  std::array<int, kScalarTypes> byType{};
  for (size_t i = 0; i < kScalarTypes; ++i) {
    byType[i] = -1;
  }
  for (const auto& entry : kRealTypes) {
    byType[static_cast<size_t>(entry.first)] = entry.second;
  }
  return byType;
}();

} // namespace

std::optional<NcclElementType> ncclElementType(at::ScalarType type) {
  if (at::isComplexType(type)) {
    auto real = ncclElementType(c10::toRealValueType(type));
    return real ? std::optional<NcclElementType>({real->dtype, 2})
                : std::nullopt;
  }
  const auto index = static_cast<size_t>(type);
  if (index >= kScalarTypes || kNcclTypeOf[index] < 0) {
    return std::nullopt;
  }
  return NcclElementType{static_cast<ncclDataType_t>(kNcclTypeOf[index]), 1};
}

} // namespace nccl_core

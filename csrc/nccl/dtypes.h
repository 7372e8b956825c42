// How NCCL sees a torch dtype.
#pragma once

#include <c10/core/ScalarType.h>
#include <nccl.h>

#include <optional>

namespace nccl_core {

struct NcclElementType {
  ncclDataType_t dtype;
  // NCCL elements per torch element: complex numbers travel as two reals.
  int perElement;
};

// nullopt for dtypes NCCL cannot carry. bool travels as uint8.
std::optional<NcclElementType> ncclElementType(at::ScalarType type);

// For error messages.
constexpr const char* kSupportedDtypes =
    "int8, uint8, bool, int32, uint32, int64, uint64, float16, bfloat16, "
    "float32, float64, float8_e4m3fn, float8_e5m2, complex64, complex128";

} // namespace nccl_core

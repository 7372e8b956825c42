#pragma once

#include <pybind11/pybind11.h>

namespace nccl_core {

// torch_nccl_core._testing's CommRoutes (routes.cpp).
void bindRoutes(pybind11::module_& testing);

} // namespace nccl_core

#pragma once

#include <pybind11/pybind11.h>

namespace nccl_core {

// torch_nccl_core._C._testing: host-side logic over fakes, for CPU tests.
void bindTesting(pybind11::module_& m);
// Its CommRoutes (testing_routes.cpp).
void bindRoutes(pybind11::module_& testing);

} // namespace nccl_core

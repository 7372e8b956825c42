#pragma once

#include <pybind11/pybind11.h>

namespace nccl_core {

// torch_nccl_core._testing's CommRoutes (routes.cpp).
void bindRoutes(pybind11::module_& testing);
// enqueue_op: an op's NCCL calls on the fake (nccl_calls.cpp).
void bindNcclCalls(pybind11::module_& testing);

} // namespace nccl_core

#pragma once

#include <pybind11/pybind11.h>

namespace nccl_core {

// torch_nccl_core._C._testing: host-side logic over fakes, for CPU tests.
void bindTesting(pybind11::module_& m);

} // namespace nccl_core

// C++ errors as the Python exceptions torch's own bindings raise for them
// (DistBackendError, ValueError, ...): a pybind11 exception translator.
#pragma once

#include <exception>

namespace nccl_core {

// Registered with py::register_local_exception_translator by each module of
// the package.
void translateErrors(std::exception_ptr error);

} // namespace nccl_core

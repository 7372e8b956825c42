#pragma once

#include <pybind11/pybind11.h>

namespace nccl_core {

void bindCommunicator(pybind11::module_& m);
// Adds the one-sided methods to Communicator; after bindCommunicator.
void bindOneSided(pybind11::module_& m);

} // namespace nccl_core

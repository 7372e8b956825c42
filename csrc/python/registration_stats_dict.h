// RegistrationStats as Python sees it: one dict for _C's group API and the
// test doubles' routes alike.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "backend/routing/comm_routes.h"

namespace nccl_core {

inline pybind11::dict registrationStatsDict(const RegistrationStats& stats) {
  return pybind11::dict(
      pybind11::arg("registrations") = stats.registrations,
      pybind11::arg("bytes") = stats.bytes,
      pybind11::arg("first_uses") = stats.firstUses,
      pybind11::arg("first_use_seconds") = stats.firstUseSeconds,
      pybind11::arg("upgraded_windows") = stats.upgradedWindows,
      pybind11::arg("upgraded_window_bytes") = stats.upgradedWindowBytes);
}

} // namespace nccl_core

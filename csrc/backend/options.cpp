#include "backend/options.h"

#include <c10/util/Exception.h>
#include <c10/util/env.h>

#include <utility>

#include "nccl/errors.h"

namespace nccl_core {

namespace {

// NCCL_CTA_POLICY_* by name: every NCCL this package loads on has the three
// (NCCL 2.28's nccl.h; "zero", copy-engine collectives, reaches across nodes
// from 2.30.7, per its release notes).
struct CtaPolicy {
  const char* name;
  int value;
};
constexpr CtaPolicy kCtaPolicies[] = {
    {"default", 0x00},
    {"efficiency", 0x01},
    {"zero", 0x02}};

const CtaPolicy* ctaPolicyNamed(const std::string& name) {
  for (const CtaPolicy& policy : kCtaPolicies) {
    if (name == policy.name) {
      return &policy;
    }
  }
  return nullptr;
}

constexpr std::pair<const char*, AllReduceKernels> kAllReduceKernels[] = {
    {"auto", AllReduceKernels::Auto},
    {"off", AllReduceKernels::Off},
    {"one_shot", AllReduceKernels::OneShot},
    {"two_shot", AllReduceKernels::TwoShot}};

} // namespace

AllReduceKernels NcclCoreOptions::allReduceKernelsSetting() const {
  const std::string name = allReduceKernels.value_or(
      c10::utils::get_env("TORCH_NCCL_CORE_ALL_REDUCE_KERNELS")
          .value_or("auto"));
  for (const auto& [known, setting] : kAllReduceKernels) {
    if (name == known) {
      return setting;
    }
  }
  NCCL_CORE_CHECK_ARG(
      false,
      "Options",
      "all_reduce_kernels (or TORCH_NCCL_CORE_ALL_REDUCE_KERNELS) must be "
      "'auto', 'off', 'one_shot' or 'two_shot', got '",
      name,
      "'");
  return AllReduceKernels::Auto;
}

void NcclCoreOptions::validate() const {
  if (allReduceKernels) {
    allReduceKernelsSetting();
  }
  if (ctaPolicy) {
    NCCL_CORE_CHECK_ARG(
        ctaPolicyNamed(*ctaPolicy) != nullptr,
        "Options",
        "cta_policy must be 'default', 'efficiency' or 'zero', got '",
        *ctaPolicy,
        "'");
  }
  if (timeout) {
    NCCL_CORE_CHECK_ARG(
        timeout->count() > 0,
        "Options",
        "timeout must be positive, got ",
        timeout->count(),
        " ms");
  }
  if (cgaClusterSize) {
    NCCL_CORE_CHECK_ARG(
        *cgaClusterSize >= 0 && *cgaClusterSize <= 8,
        "Options",
        "cga_cluster_size must be in [0, 8], got ",
        *cgaClusterSize);
  }
  for (const auto& [name, value] :
       {std::pair{"min_ctas", minCtas}, std::pair{"max_ctas", maxCtas}}) {
    if (value) {
      NCCL_CORE_CHECK_ARG(
          *value >= 1 && *value <= 64,
          "Options",
          name,
          " must be in [1, 64], got ",
          *value);
    }
  }
  if (minCtas && maxCtas) {
    NCCL_CORE_CHECK_ARG(
        *minCtas <= *maxCtas,
        "Options",
        "min_ctas (",
        *minCtas,
        ") must not exceed max_ctas (",
        *maxCtas,
        ")");
  }
}

bool NcclCoreOptions::registersCachingAllocator() const {
  return registerCachingAllocator.value_or(
      c10::utils::check_env("TORCH_NCCL_CORE_REGISTER_ALLOCATOR")
          .value_or(false));
}

std::optional<bool> NcclCoreOptions::gatherScatterKernelsSetting() const {
  return gatherScatterKernels
             ? gatherScatterKernels
             : c10::utils::check_env("TORCH_NCCL_CORE_GATHER_SCATTER_KERNELS");
}

std::optional<bool> NcclCoreOptions::copyEngineReduceScatterSetting() const {
  return copyEngineReduceScatter
             ? copyEngineReduceScatter
             : c10::utils::check_env(
                   "TORCH_NCCL_CORE_COPY_ENGINE_REDUCE_SCATTER");
}

bool NcclCoreOptions::upgradesWindows() const {
  return windowUpgrade.value_or(
      c10::utils::check_env("TORCH_NCCL_CORE_WINDOW_UPGRADE").value_or(false));
}

ncclConfig_t NcclCoreOptions::toNcclConfig() const {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // torch's switch for its NCCL backend, where the option is left unset.
  // Only nonblocking communicators have initialization, splits and
  // registrations bounded by the timeout and abortable (docs/design.md).
  if (const auto choice =
          blocking ? std::optional<bool>(!*blocking)
                   : c10::utils::check_env("TORCH_NCCL_USE_COMM_NONBLOCKING")) {
    config.blocking = *choice ? 0 : 1;
  }
  if (cgaClusterSize) {
    config.cgaClusterSize = *cgaClusterSize;
  }
  if (minCtas) {
    config.minCTAs = *minCtas;
  }
  if (maxCtas) {
    config.maxCTAs = *maxCtas;
  }
  if (netName) {
    config.netName = netName->c_str();
  }
  if (splitShare) {
    config.splitShare = *splitShare ? 1 : 0;
  }
  if (commName) {
    config.commName = commName->c_str();
  }
  if (ctaPolicy) {
    if (const CtaPolicy* policy = ctaPolicyNamed(*ctaPolicy)) {
      config.CTAPolicy = policy->value;
    }
  }
  return config;
}

} // namespace nccl_core

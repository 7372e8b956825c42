#include "nccl/version.h"

#include <iterator>

#include <nccl.h>

#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

struct FeatureInfo {
  Feature feature;
  const char* name;
  int minCode;
};

// The NCCL release that brought each feature, from its release notes and
// headers (docs/compatibility.md), in Feature's order.
// clang-format off: a table, one feature a row
constexpr FeatureInfo kFeatures[] = {
    {Feature::Float8, "float8", NCCL_VERSION(2, 24, 0)},
    {Feature::WindowRegistration, "window_registration", NCCL_VERSION(2, 27, 0)},
    {Feature::DeviceApi, "device_api", NCCL_VERSION(2, 28, 0)},
    {Feature::HostOneSided, "host_one_sided", NCCL_VERSION(2, 29, 0)},
    {Feature::WindowHostPointers, "window_host_pointers", NCCL_VERSION(2, 29, 0)},
    {Feature::WindowStrictOrdering, "window_strict_ordering", NCCL_VERSION(2, 29, 0)},
    {Feature::CommGrow, "comm_grow", NCCL_VERSION(2, 29, 0)},
    {Feature::SuspendResume, "suspend_resume", NCCL_VERSION(2, 29, 7)},
    // dev_runtime.cc's lsaMaxSize
    {Feature::WindowSizesPerRank, "window_sizes_per_rank", NCCL_VERSION(2, 30, 7)},
    {Feature::WindowRegistrationInCapture, "window_registration_in_capture", NCCL_VERSION(2, 30, 0)},
    {Feature::OneSidedGraphCapture, "one_sided_graph_capture", NCCL_VERSION(2, 30, 7)},
    // Across nodes (hierarchical) from 2.30.7.
    {Feature::ZeroCtaPolicy, "zero_cta_policy", NCCL_VERSION(2, 28, 0)},
    {Feature::PerCollectiveConfig, "per_collective_config", NCCL_VERSION(2, 31, 0)},
    {Feature::SocketGin, "socket_gin", NCCL_VERSION(2, 32, 3)},
    {Feature::WindowGinOnly, "window_gin_only", NCCL_VERSION(2, 32, 3)},
    // 2.32.3's commDestroySync; not 2.31.
    {Feature::FinalizeWaitsForHost, "finalize_waits_for_host", NCCL_VERSION(2, 32, 0)},
};
// clang-format on

constexpr bool inEnumOrder() {
  for (size_t i = 0; i < std::size(kFeatures); ++i) {
    if (static_cast<size_t>(kFeatures[i].feature) != i) {
      return false;
    }
  }
  return true;
}
static_assert(
    inEnumOrder() &&
        std::size(kFeatures) == static_cast<size_t>(Feature::Count),
    "kFeatures lists every Feature, in its order");

const FeatureInfo& info(Feature feature) {
  TORCH_INTERNAL_ASSERT(feature < Feature::Count, "not a feature");
  return kFeatures[static_cast<size_t>(feature)];
}

} // namespace

const NcclVersion& runtimeVersion() {
  static const NcclVersion version = [] {
    int code = 0;
    NCCL_CORE_CHECK(realNccl(), realNccl().getVersion(&code));
    // Since 2.9 the code is major * 10000 + minor * 100 + patch.
    return NcclVersion{code / 10000, (code % 10000) / 100, code % 100, code};
  }();
  return version;
}

std::string versionText(int code) {
  return c10::str(code / 10000, ".", code % 10000 / 100, ".", code % 100);
}

bool hasFeature(Feature feature) {
  return runtimeVersion().code >= info(feature).minCode;
}

std::map<std::string, bool> featureMap() {
  std::map<std::string, bool> features;
  for (const FeatureInfo& feature : kFeatures) {
    features[feature.name] = hasFeature(feature.feature);
  }
  // Always present on the NCCL >= 2.28 this package requires; listed so
  // callers can test for them uniformly.
  for (const char* name :
       {"comm_split",
        "nonblocking_init",
        "premul_sum",
        "bfloat16",
        "buffer_registration",
        "mem_alloc",
        "all_to_all",
        "gather",
        "scatter"}) {
    features[name] = true;
  }
  return features;
}

} // namespace nccl_core

#include "nccl/version.h"

#include <nccl.h>

#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

struct FeatureInfo {
  const char* name;
  int minCode;
};

// The NCCL release that brought each feature, from its release notes and
// headers (docs/compatibility.md).
FeatureInfo info(Feature feature) {
  switch (feature) {
    case Feature::Float8:
      return {"float8", NCCL_VERSION(2, 24, 0)};
    case Feature::WindowRegistration:
      return {"window_registration", NCCL_VERSION(2, 27, 0)};
    case Feature::DeviceApi:
      return {"device_api", NCCL_VERSION(2, 28, 0)};
    case Feature::HostOneSided:
      return {"host_one_sided", NCCL_VERSION(2, 29, 0)};
    case Feature::WindowHostPointers:
      return {"window_host_pointers", NCCL_VERSION(2, 29, 0)};
    case Feature::WindowStrictOrdering:
      return {"window_strict_ordering", NCCL_VERSION(2, 29, 0)};
    case Feature::CommGrow:
      return {"comm_grow", NCCL_VERSION(2, 29, 0)};
    case Feature::SuspendResume:
      return {"suspend_resume", NCCL_VERSION(2, 29, 7)};
    case Feature::WindowSizesPerRank: // dev_runtime.cc's lsaMaxSize
      return {"window_sizes_per_rank", NCCL_VERSION(2, 30, 7)};
    case Feature::WindowRegistrationInCapture:
      return {"window_registration_in_capture", NCCL_VERSION(2, 30, 0)};
    case Feature::OneSidedGraphCapture:
      return {"one_sided_graph_capture", NCCL_VERSION(2, 30, 7)};
    case Feature::ZeroCtaPolicy: // across nodes (hierarchical) from 2.30.7
      return {"zero_cta_policy", NCCL_VERSION(2, 28, 0)};
    case Feature::PerCollectiveConfig:
      return {"per_collective_config", NCCL_VERSION(2, 31, 0)};
    case Feature::SocketGin:
      return {"socket_gin", NCCL_VERSION(2, 32, 3)};
    case Feature::WindowGinOnly:
      return {"window_gin_only", NCCL_VERSION(2, 32, 3)};
    case Feature::FinalizeWaitsForHost: // 2.32.3's commDestroySync; not 2.31
      return {"finalize_waits_for_host", NCCL_VERSION(2, 32, 0)};
  }
  return {"unknown", 0};
}

constexpr Feature kAllFeatures[] = {
    Feature::Float8,
    Feature::WindowRegistration,
    Feature::DeviceApi,
    Feature::HostOneSided,
    Feature::WindowHostPointers,
    Feature::WindowStrictOrdering,
    Feature::CommGrow,
    Feature::SuspendResume,
    Feature::WindowSizesPerRank,
    Feature::WindowRegistrationInCapture,
    Feature::OneSidedGraphCapture,
    Feature::ZeroCtaPolicy,
    Feature::PerCollectiveConfig,
    Feature::SocketGin,
    Feature::WindowGinOnly,
    Feature::FinalizeWaitsForHost};

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
  for (Feature feature : kAllFeatures) {
    features[info(feature).name] = hasFeature(feature);
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

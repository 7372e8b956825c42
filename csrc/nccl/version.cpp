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
  }
  return {"unknown", 0};
}

constexpr Feature kAllFeatures[] = {
    Feature::Float8,
    Feature::WindowRegistration,
    Feature::DeviceApi,
    Feature::HostOneSided,
    Feature::WindowHostPointers,
    Feature::WindowStrictOrdering};

} // namespace

const NcclVersion& runtimeVersion() {
  static const NcclVersion version = [] {
    int code = 0;
    NCCL_CORE_CHECK(nccl().getVersion(&code));
    // Since 2.9 the code is major * 10000 + minor * 100 + patch.
    return NcclVersion{code / 10000, (code % 10000) / 100, code % 100, code};
  }();
  return version;
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

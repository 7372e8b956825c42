// The one seam where NCCL version differences are decided: the runtime
// library's version and the features it offers. The extension links only
// symbols of NCCL 2.28, so one build loads on every NCCL >= 2.28; features of
// newer releases are switched on from the runtime version.
#pragma once

#include <map>
#include <string>

namespace nccl_core {

struct NcclVersion {
  int major;
  int minor;
  int patch;
  // NCCL_VERSION(major, minor, patch), comparable with NCCL_VERSION_CODE.
  int code;
};

// The version of the libnccl.so.2 loaded in this process (not the headers').
const NcclVersion& runtimeVersion();

// "2.30.7" for NCCL_VERSION(2, 30, 7), as errors name releases.
std::string versionText(int code);

// Minimum runtime versions of optional features (docs/compatibility.md says
// which of them the package uses, and how). version.cpp's table lists them in
// this order.
enum class Feature {
  Float8,               // ncclFloat8e4m3 / ncclFloat8e5m2
  WindowRegistration,   // ncclCommWindowRegister
  DeviceApi,            // ncclDevCommCreate (device communicators)
  HostOneSided,         // ncclPutSignal / ncclSignal / ncclWaitSignal
  WindowHostPointers,   // ncclWinGetUserPtr and host-side peer pointers
  WindowStrictOrdering, // NCCL_WIN_STRICT_ORDERING
  CommGrow,             // ncclCommGrow, ncclCommGetUniqueId
  SuspendResume,        // ncclCommSuspend / ncclCommResume / ncclCommMemStats
  WindowSizesPerRank,   // windows in allocations of different sizes by rank
  WindowRegistrationInCapture, // ncclCommWindowRegister during a capture
  OneSidedGraphCapture,        // ncclPutSignal / ncclWaitSignal in CUDA graphs
  ZeroCtaPolicy,               // NCCL_CTA_POLICY_ZERO (copy-engine collectives)
  PerCollectiveConfig,         // ncclCollConfig_t on each collective call
  SocketGin,                   // GPU-initiated networking over TCP sockets
  WindowGinOnly,               // NCCL_WIN_GIN_ONLY
  FinalizeWaitsForHost, // ncclCommFinalize ends with a barrier of the host's
                        // ranks
  Count,                // not a feature: how many there are
};

bool hasFeature(Feature feature);

// Every feature by name, for torch_nccl_core.features().
std::map<std::string, bool> featureMap();

} // namespace nccl_core

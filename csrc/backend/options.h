// User options of the nccl_core backend (torch_nccl_core.Options) and their
// translation to ncclConfig_t.
#pragma once

#include <nccl.h>

#include <chrono>
#include <optional>
#include <string>

#include "nccl/api.h"

namespace nccl_core {

// The values of NcclCoreOptions::allReduceKernels.
enum class AllReduceKernels { Auto, Off, OneShot, TwoShot };

struct NcclCoreOptions {
  // Unset: the timeout torch.distributed passes when it creates the group.
  std::optional<std::chrono::milliseconds> timeout;
  bool highPriorityStream = false;
  // Unset fields keep NCCL's own defaults (and its NCCL_* environment).
  std::optional<bool> blocking;
  std::optional<int> cgaClusterSize;
  std::optional<int> minCtas;
  std::optional<int> maxCtas;
  std::optional<std::string> netName;
  std::optional<bool> splitShare;
  std::optional<std::string> commName;
  // Reduce-scatter through the copy engine where every peer is load/store
  // reachable: unset = TORCH_NCCL_CORE_COPY_ENGINE_REDUCE_SCATTER, off where
  // that is unset too; true = at every size, false = never
  // (backend/engines/copy_engine_reduce_scatter.h).
  std::optional<bool> copyEngineReduceScatter;
  // All-reduce through the package's one-shot and two-shot kernels where
  // every peer is load/store reachable (backend/engines/
  // load_store_collectives.h): "auto" (at the sizes where they were measured
  // faster than NCCL at the group's size), "off", "one_shot" or "two_shot"
  // (that kernel at every size its staging holds); unset =
  // TORCH_NCCL_CORE_ALL_REDUCE_KERNELS, "auto" if that is unset too. Every
  // rank of a group must ask the same.
  std::optional<std::string> allReduceKernels;
  // all_gather_into_tensor and reduce_scatter_tensor through the package's
  // load/store kernels where every peer is load/store reachable (the same
  // engine): unset = TORCH_NCCL_CORE_GATHER_SCATTER_KERNELS, and where that
  // is unset too at the sizes measured faster than NCCL; true = up to the
  // staging's size, false = never.
  std::optional<bool> gatherScatterKernels;
  // Ops on ordinary tensors register the segment of torch's caching
  // allocator they lie in, on first use, and torch's free of the segment
  // drops it: unset = TORCH_NCCL_CORE_REGISTER_ALLOCATOR (default off: on 2
  // GPUs it gained nothing measurable, docs/performance.md), true = on,
  // false = off (nccl/caching_allocator_segments.h).
  std::optional<bool> registerCachingAllocator;
  // An all-reduce or reduce-scatter that runs on the same buffers a third
  // time, at sizes where NCCL's symmetric kernels pay, gets them registered
  // as symmetric windows by every rank together (backend/routing/
  // window_upgrade.h): unset = TORCH_NCCL_CORE_WINDOW_UPGRADE (default off),
  // true = on, false = off.
  std::optional<bool> windowUpgrade;
  // NCCL's CTA policy (ncclConfig_t.CTAPolicy): "default", "efficiency", or
  // "zero" (all_gather and all_to_all on copy engines, no SMs, where NCCL can);
  // unset keeps NCCL's (and NCCL_CTA_POLICY).
  std::optional<std::string> ctaPolicy;
  // The NCCL entry points of the group's communicators: NCCL's own, unless a
  // test injects a scripted table (torch_nccl_core._testing).
  const NcclApi* api = &realNccl();

  // Whether registerCachingAllocator is on, the environment deciding where
  // it is unset.
  bool registersCachingAllocator() const;
  // Whether windowUpgrade is on, likewise.
  bool upgradesWindows() const;
  // allReduceKernels, the environment deciding where it is unset; raises
  // ValueError for a name it does not know.
  AllReduceKernels allReduceKernelsSetting() const;
  // gatherScatterKernels and copyEngineReduceScatter, the environment
  // deciding where they are unset; unset there too: their defaults.
  std::optional<bool> gatherScatterKernelsSetting() const;
  std::optional<bool> copyEngineReduceScatterSetting() const;

  // Raises ValueError for out-of-range values.
  void validate() const;

  // The returned config points into this object's strings: keep it alive
  // while NCCL uses the config.
  ncclConfig_t toNcclConfig() const;
};

} // namespace nccl_core

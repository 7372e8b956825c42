#include "backend/engines/copy_engine_reduce_scatter.h"
#include "backend/engines/engine.h"
#include "backend/engines/load_store_collectives.h"

namespace nccl_core {

Engines makeEngines(
    Communicator& comm,
    EventPool& events,
    const NcclCoreOptions& options) {
  Engines engines;
  // First: at the sizes its table gives it, it beats the copy engine too.
  if (KernelChoice::of(options, comm.size(), false).maxBytes() +
          KernelChoice::of(options, comm.size(), true).maxBytes() >
      0) {
    engines.push_back(
        std::make_unique<LoadStoreCollectives>(comm, events, options));
  }
  // Off unless asked: alone it beats NCCL from 32 MiB of output, but in an
  // FSDP2 step its host time per call made the step slower
  // (docs/performance.md, "Training step").
  if (options.copyEngineReduceScatterSetting().value_or(false)) {
    engines.push_back(std::make_unique<CopyEngineReduceScatter>(comm, events));
  }
  return engines;
}

} // namespace nccl_core

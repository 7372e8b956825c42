#include "backend/engines/copy_engine_reduce_scatter.h"
#include "backend/engines/engine.h"
#include "backend/engines/load_store_all_reduce.h"

namespace nccl_core {

Engines makeEngines(
    Communicator& comm,
    EventPool& events,
    const NcclCoreOptions& options) {
  Engines engines;
  if (options.copyEngineReduceScatter != false) {
    engines.push_back(
        std::make_unique<CopyEngineReduceScatter>(
            comm, events, options.copyEngineReduceScatter == true));
  }
  const AllReduceKernels allReduce = options.allReduceKernelsSetting();
  if (AllReduceKernelChoice::of(allReduce, comm.size(), false).maxBytes() +
          AllReduceKernelChoice::of(allReduce, comm.size(), true).maxBytes() >
      0) {
    engines.push_back(
        std::make_unique<LoadStoreAllReduce>(comm, events, allReduce));
  }
  return engines;
}

} // namespace nccl_core

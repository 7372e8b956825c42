#include <c10/util/env.h>

#include "backend/engines/copy_engine_reduce_scatter.h"
#include "backend/engines/engine.h"
#include "backend/engines/one_shot_all_reduce.h"

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
  if (options.oneShotAllReduce.value_or(
          c10::utils::check_env("TORCH_NCCL_CORE_ONE_SHOT_ALL_REDUCE")
              .value_or(false))) {
    engines.push_back(std::make_unique<OneShotAllReduce>(comm, events));
  }
  return engines;
}

} // namespace nccl_core

// The backend's own engines: code that runs an op in NCCL's place where it
// measures faster (the copy engine's reduce-scatter, the load/store kernels).
// Routing (backend/routing/comm_routes.h) walks the group's engines in order
// and gives the op to the first that suits it; NCCL runs the rest. A new
// engine is a class here and a line in makeEngines.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <optional>
#include <vector>

#include "backend/options.h"
#include "backend/runtime/event_pool.h"
#include "nccl/communicator.h"

namespace nccl_core {

// An op an engine may run, as launch() was given it: its first output and
// first input (one tensor for an in-place op).
struct EngineCall {
  c10d::OpType type;
  const at::Tensor& output;
  const at::Tensor& input;
  std::optional<c10d::ReduceOp::RedOpType> reduction; // a built-in one
  bool capturing; // under CUDA stream capture
};

class Engine {
 public:
  Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  virtual ~Engine() = default;

  // Whether it runs `call`: the same answer on every rank for the same call
  // and the same history of calls.
  virtual bool suits(const EngineCall& call) = 0;
  // Enqueues `call` on `stream`, ordered as an NCCL call there would be.
  virtual void enqueue(const EngineCall& call, cudaStream_t stream) = 0;
  // Lets its work in flight end: the communicator is being aborted.
  virtual void drain() const noexcept = 0;
  // Whether the peers map memory of its: the communicator must then be
  // aborted before the engine is destroyed.
  virtual bool hasStaging() const = 0;
};

using Engines = std::vector<std::unique_ptr<Engine>>;

// The engines `options` turn on for a group over `comm`, in the order
// routing asks them.
Engines makeEngines(
    Communicator& comm,
    EventPool& events,
    const NcclCoreOptions& options);

} // namespace nccl_core

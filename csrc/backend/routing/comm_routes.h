// Where a group's ops run besides its communicator, and the memory each
// communicator registered for them: the backend's routing state. The NCCL
// layer holds none of this policy; it tells this object of windows and of
// its abort (CommunicatorListener).
// - The window-free twin: a second communicator over the same ranks, made
//   (collectively) with the first symmetric window. It holds no windows, so
//   ops that NCCL's symmetric kernels would slow down (policy.h) run there,
//   on buffer-registered memory.
// - The backend's engines (backend/engines/engine.h), which run an op in
//   NCCL's place where they suit it.
// - Automatic registration (TORCH_NCCL_CORE_AUTO_REGISTER): NCCL memory an op
//   touches is registered with the communicator that runs it, once; so is
//   the segment of torch's caching allocator an ordinary tensor lies in, where
//   the group asked for it (Options.register_caching_allocator).
// - Registered memory pools (register_mem_pool): their segments, registered
//   at once.
// - The lazy window upgrade (window_upgrade.h), where the group asked for it.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "backend/engines/engine.h"
#include "backend/routing/window_upgrade.h"
#include "nccl/allocations.h"
#include "nccl/caching_allocator_segments.h"
#include "nccl/communicator.h"

namespace nccl_core {

// Which memory an op's route registers with its communicator on first use.
struct AutoRegistration {
  bool ncclMemory = true;        // TORCH_NCCL_CORE_AUTO_REGISTER
  bool cachingAllocator = false; // Options.register_caching_allocator
  // Options.window_upgrade, where NCCL's symmetric kernels can run (every
  // peer load/store reachable).
  bool windowUpgrade = false;
};

// What the group holds registered, and what registering on first use cost.
struct RegistrationStats {
  size_t registrations = 0; // live, on the communicator and its twin
  size_t bytes = 0;
  size_t firstUses = 0; // registrations ops asked NCCL for, refused included
  double firstUseSeconds = 0; // their time, all together
  size_t upgradedWindows = 0; // windows the upgrade registered, closed too
  size_t upgradedWindowBytes = 0;
};

// What an op asks of routing (NcclCoreBackend::prepare fills it in).
struct RouteQuery {
  c10d::OpType type;
  const std::vector<at::Tensor>& outputs;
  const std::vector<at::Tensor>& inputs;
  // A collective NCCL may give symmetric kernels: it may move to the twin.
  bool routable = false;
  bool engines = false; // one of the backend's engines may run it
  std::optional<c10d::ReduceOp::RedOpType> reduction; // a built-in one
  bool capturing = false;
  bool coalescing = false; // every op of an NCCL group runs on one comm
  // The ranks' meeting for a window upgrade; null: no upgrade.
  const AgreeFn* agree = nullptr;
};

// An op that one of the backend's own engines runs in NCCL's place,
// enqueued on the given stream.
using EngineRun = std::function<void(cudaStream_t)>;

// Where an op runs, settled by one look at its tensors.
struct Route {
  Communicator& comm; // the group's communicator or its twin
  EngineRun engine;   // set: NCCL runs nothing
  // NCCL memory of the op's to register with `comm` before it runs.
  c10::SmallVector<Allocation, 2> toRegister;
};

class CommRoutes final : public CommunicatorListener,
                         public AllocationObserver,
                         public std::enable_shared_from_this<CommRoutes> {
 public:
  // Routes for `comm`'s ops, told of its windows and of its abort from now
  // on; `engines` (over `comm`) may run ops in NCCL's place.
  static std::shared_ptr<CommRoutes> attach(
      std::shared_ptr<Communicator> comm,
      AutoRegistration autoRegister,
      Engines engines);
  CommRoutes(const CommRoutes&) = delete;
  CommRoutes& operator=(const CommRoutes&) = delete;
  // Aborts the communicator first if it still maps an engine's staging.
  ~CommRoutes() override;

  Route route(const RouteQuery& query);
  // Registers what `route` found unregistered (local, may take a while).
  void registerMemory(Route& route);
  // Registers `segments` (torch allocator segments on this communicator's
  // device) with the group's communicator now; the buffers, one a segment.
  std::vector<std::shared_ptr<RegisteredBuffer>>
  registerSegments(const std::vector<Segment>& segments);
  RegistrationStats registrationStats() const;

  // The twin; null before the first symmetric window.
  std::shared_ptr<Communicator> twin() const;
  // The group's communicator and its twin time their nonblocking calls out
  // after `timeout`.
  void setTimeout(std::chrono::milliseconds timeout);

  void beforeWindow(Communicator& comm, int flags) override;
  void windowRegistered(const std::shared_ptr<Window>& window) override;
  // Drains the engines (their copies into peers' memory end first) and
  // stops the twin's kernels, whose ops a silent peer may keep running.
  void aborting() noexcept override;
  // Aborts the twin, once the group's communicator was: a twin freed first
  // waited for the group's kernels, which a silent peer kept running.
  void aborted() noexcept override;
  void onFree(const Allocation& allocation) noexcept override;

 private:
  CommRoutes(
      std::shared_ptr<Communicator> comm,
      AutoRegistration autoRegister,
      Engines engines);

  // What is known of one NCCL allocation, by id.
  struct Memory {
    std::vector<std::weak_ptr<Window>> windows; // of the group's communicator
    std::shared_ptr<RegisteredBuffer> onComm;   // automatic registrations
    std::shared_ptr<RegisteredBuffer> onTwin;
    // NCCL refused to register this caching-allocator memory (an expandable
    // range of several physical allocations, before NCCL 2.29): its ops run
    // unregistered, NCCL copying it.
    bool unregistrable = false;
  };
  // An op's NCCL tensor as the lookup found it.
  struct Touched {
    Allocation allocation;
    int windowFlags = -1; // -1: in no window; else the covering one's flags
    bool onComm = false;  // registered there already
    bool onTwin = false;
    bool unregistrable = false;
  };
  // The op's NCCL tensors, each with its allocation.
  using Found = c10::SmallVector<std::pair<const at::Tensor*, Allocation>, 4>;
  // What this table knows of them, read under one shared lock.
  struct Lookup {
    c10::SmallVector<Touched, 4> touched;
    bool inSymmetricWindow = false; // any of them
    std::shared_ptr<Communicator> twin;
  };
  Lookup lookUp(const Found& found) const;
  // Registers `allocation` with `comm`; null where NCCL refused memory of
  // torch's allocator, which is then marked unregistrable.
  std::shared_ptr<RegisteredBuffer>
  tryRegister(Communicator& comm, const Allocation& allocation);
  // Keeps `made` as the registration of `allocation` on the communicator (or
  // its twin) unless another thread's op made one meanwhile: the one kept.
  std::shared_ptr<RegisteredBuffer> keep(
      uint64_t allocation,
      bool onTwin,
      std::shared_ptr<RegisteredBuffer> made);
  // An engine's run of `query` when one suits it.
  EngineRun engineFor(const RouteQuery& query);
  // Whether an engine's staging is mapped by the peers.
  bool hasStaging() const;

  const std::shared_ptr<Communicator> comm_;
  const AutoRegistration autoRegister_;
  // Registrations ops made, and their time (registrationStats).
  std::atomic<size_t> firstUses_{0};
  std::atomic<int64_t> firstUseNanos_{0};

  // Read by every op that touches NCCL memory, written on registration,
  // window and free.
  mutable std::shared_mutex mutex_;
  // Held across the twin's split: a second window registration waits and
  // finds the twin made, on every rank alike.
  std::mutex twinMutex_;
  std::unordered_map<uint64_t, Memory> memory_;
  std::shared_ptr<Communicator> twin_;
  std::atomic<bool> hasTwin_{false}; // twin_ set: a lock-free look per op
  const Engines engines_;
  const std::unique_ptr<WindowUpgrade> upgrade_; // null unless asked for
};

} // namespace nccl_core

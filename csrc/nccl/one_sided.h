// One-sided operations on windows (nccl4py's Communicator.put_signal /
// signal / wait_signal), with two engines behind one behaviour.
//  - Host: NCCL >= 2.29's ncclPutSignal / ncclSignal / ncclWaitSignal.
//  - LoadStore (NCCL 2.28, LSA peers): the copy engine writes the data
//    through the window's peer mapping, and one-thread kernels raise and wait
//    on signal counters in a signal window every rank registered together.
//    Counters live in device memory, so captured CUDA graphs replay with the
//    same meaning (each replay signals and consumes afresh).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <c10/core/Allocator.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "nccl/peer_buffer.h"

namespace nccl_core {

class Communicator;
class Window;

struct WaitSignalDesc {
  int peer;
  int opCount = 1;
  int signalIndex = 0;
  int context = 0;
};

enum class OneSidedEngine { Host, LoadStore };

// TORCH_NCCL_CORE_ONE_SIDED_ENGINE: "auto" (Host where the runtime has it),
// "nccl" or "load_store"; refused when the runtime cannot run the choice.
OneSidedEngine oneSidedEngine();

// Independent signal counters per peer: the user's one-sided operations and
// the copy-engine reduce-scatter's two directions never take each other's
// signals.
enum class SignalChannel : int { OneSided, StagingFilled, StagingFreed };
constexpr int kSignalChannels = 3;

// Signal counters every rank maps (the LoadStore engine's, and the
// copy-engine reduce-scatter's).
class SignalWindow {
 public:
  // Collective over `comm`: every rank allocates and registers its inboxes.
  explicit SignalWindow(Communicator& comm);
  SignalWindow(const SignalWindow&) = delete;
  SignalWindow& operator=(const SignalWindow&) = delete;

  // This rank's counter at `peer` (what `peer` waits on for us).
  uint64_t* remoteCounter(int peer, SignalChannel channel) const;
  // Counters by peer: signals received, and signals consumed by waits.
  uint64_t* inbox(SignalChannel channel) const;
  uint64_t* consumed(SignalChannel channel) const;
  // Read by waiting kernels: once set, they return without their signals.
  const int* abortFlag() const;
  // Ends every pending and future wait (the communicator is being aborted).
  void abortWaits() noexcept;
  // Enqueues a wait for `count` signals from each peer but this rank.
  void
  waitAllPeers(SignalChannel channel, int count, cudaStream_t stream) const;
  // Enqueues one signal to each peer but this rank.
  void signalAllPeers(SignalChannel channel, cudaStream_t stream) const;

 private:
  struct HostFree {
    void operator()(int* flag) const noexcept;
  };
  uint64_t* counters(int index) const;

  // Host memory the device reads (mapped): a spinning kernel sees it change.
  // Declared before counters_ so it outlives them: freeing them waits for the
  // device, whose waits return once this flag is set.
  std::unique_ptr<int, HostFree> abortFlag_;
  int* abortFlagOnDevice_ = nullptr;
  // inbox[channel][peer], then consumed[channel][peer].
  PeerBuffer counters_;
  int self_ = 0;
  int size_ = 0;
};

// The group a communicator serves (the nccl_core backend): it numbers the
// one-sided ops on the communicator like its other ops, refuses them once it
// failed, and has its watchdog time them like synchronous ops, so that a wait
// whose signals never come ends in DistBackendError at the group's timeout.
class OneSidedGroup {
 public:
  // Runs `enqueue`, which enqueues one-sided op `name` toward `peers` on
  // `stream`; `waits`: the op waits for its peers' signals.
  virtual void runOneSided(
      const char* name,
      c10::ArrayRef<int> peers,
      bool waits,
      cudaStream_t stream,
      c10::function_ref<void()> enqueue) = 0;

 protected:
  ~OneSidedGroup() = default;
};

// While alive, `group` runs the one-sided ops on `comm`. The communicator may
// outlive its group (Python holds it): the destructor waits for the ops
// running through the group, and later ops run without one.
class OneSidedLink {
 public:
  OneSidedLink(const Communicator& comm, OneSidedGroup& group);
  OneSidedLink(const OneSidedLink&) = delete;
  OneSidedLink& operator=(const OneSidedLink&) = delete;
  ~OneSidedLink();

  struct State;

 private:
  const Communicator* const comm_;
  const std::shared_ptr<State> state_;
};

// Argument checks shared by the Python methods and the torch ops; each raises
// ValueError naming `op`.
void checkPeer(const Communicator& comm, int64_t peer, const char* op);
int checkedOpCount(int64_t count, const char* op);

// A put_signal: `bytes` from `src` (`count` elements of `dtype` as NCCL sees
// them) into `peer`'s part of `window`, `offsetBytes` in. Made by
// checkedPutSignal (backend/ops/arguments.h), which checks every field.
struct PutSignal {
  const void* src;
  size_t count;
  ncclDataType_t dtype;
  size_t bytes;
  int peer;
  const Window& window;
  size_t offsetBytes;
};

// One-sided ops on `stream`, run through the group `comm` serves (see
// OneSidedGroup), or as they are where it serves none.
void putSignal(Communicator& comm, const PutSignal& put, cudaStream_t stream);
void signal(Communicator& comm, int peer, cudaStream_t stream);
void waitSignal(
    Communicator& comm,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream);

// The same ops, enqueued as they are: for a caller that runs them as ops of
// the group itself (torch's Window API goes through the backend's op runner).
void enqueuePutSignal(
    Communicator& comm,
    const PutSignal& put,
    cudaStream_t stream);
void enqueueSignal(Communicator& comm, int peer, cudaStream_t stream);
void enqueueWaitSignal(
    Communicator& comm,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream);

namespace detail {
// one_sided_kernels.cu
void launchSignal(uint64_t* counter, cudaStream_t stream);
void launchWait(
    const uint64_t* inbox,
    uint64_t* consumed,
    const int* abortFlag,
    const std::vector<WaitSignalDesc>& descs,
    cudaStream_t stream);
} // namespace detail

} // namespace nccl_core

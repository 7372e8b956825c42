// c10d::Work of the nccl_core backend. An async op's Work owns the event
// recorded after it and keeps its tensors alive until the watchdog sees it
// complete. A synchronous op's Work has no event: the op is already ordered on
// the caller's stream.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/runtime/event_pool.h"
#include "backend/runtime/failure.h"
#include "backend/runtime/op_timing.h"

namespace nccl_core {

struct OpInfo {
  c10d::OpType type;
  const char* name; // static string, e.g. "allreduce"
  uint64_t seq;
  // A one-sided wait: shutdown ends it rather than waits for signals that
  // may never come (see SyncOpDetail::waitsOnPeers).
  bool waitsOnPeers = false;
  // The first op a coalesced block's Work stands for (`seq` is its last);
  // 0 for any other Work, which stands for `seq` alone.
  uint64_t blockStart = 0;
};

// The tensors whose data an op of `type` sends. launch() gets the one tensor
// of an op c10d runs in place (all-reduce, broadcast, reduce) as an output;
// its inputs then hold only what the op keeps alive (a PREMUL_SUM factor).
const std::vector<at::Tensor>& sentTensors(
    c10d::OpType type,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs);

// What a Work stands for: its op, the device and group it ran on, its
// timeout; the event recorded after it (none where the caller's stream, or
// the coalesced block's Work, orders it); the outputs result() returns, what
// it keeps alive until the op finished, and whether wait() blocks the host
// (barrier).
struct WorkSpec {
  OpInfo info;
  at::Device device;
  std::shared_ptr<const std::string> groupName;
  std::chrono::milliseconds timeout;
  EventPool::Event end{};
  std::vector<at::Tensor> outputs{};
  std::vector<at::Tensor> stash{};
  bool blocksHost = false;
};

class NcclWork : public c10d::Work {
 public:
  explicit NcclWork(WorkSpec spec)
      : c10d::Work(-1, spec.info.type),
        info_(spec.info),
        device_(spec.device),
        groupName_(std::move(spec.groupName)),
        end_(std::move(spec.end)),
        deadline_(std::chrono::steady_clock::now() + spec.timeout),
        blocksHost_(spec.blocksHost),
        outputs_(std::move(spec.outputs)),
        stash_(std::move(spec.stash)) {}
  ~NcclWork() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Orders the current stream after the op. Blocks the host too for
  // barrier(), for an explicit timeout, or when
  // TORCH_NCCL_CORE_BLOCKING_WAIT=1.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override;
  // Milliseconds of GPU time the op took, once it finished; only for ops
  // issued with collectives timing on (op_timing.h).
  float getDuration() const override;
  void setTiming(std::unique_ptr<OpTiming> timing);
  // The flight recorder's entries this Work completes (flight_recorder.h).
  void addTraces(c10::ArrayRef<size_t> ids) {
    traces_.insert(traces_.end(), ids.begin(), ids.end());
  }
  const std::vector<size_t>& traces() const {
    return traces_;
  }

  // For the watchdog.
  bool gpuDone() const;
  bool waitsOnPeers() const {
    return info_.waitsOnPeers;
  }
  // The number of the first op this Work stands for.
  uint64_t firstSeq() const {
    return info_.blockStart != 0 ? info_.blockStart : info_.seq;
  }
  bool pastDeadline(std::chrono::steady_clock::time_point now) const {
    return now > deadline_;
  }
  std::string describe() const;
  void markFailed(const std::string& message);
  void releaseStash();

 private:
  void waitOnHost(std::chrono::milliseconds timeout);

  const OpInfo info_;
  const at::Device device_;
  // Shared with the backend: ops copy a pointer, not the string.
  const std::shared_ptr<const std::string> groupName_;
  const EventPool::Event end_;
  const std::chrono::steady_clock::time_point deadline_;
  const bool blocksHost_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> stash_;
  std::unique_ptr<OpTiming> timing_;
  std::vector<size_t> traces_;
  FailureState failure_;
  std::mutex futureMutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

} // namespace nccl_core

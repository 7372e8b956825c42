// The ages of a group's synchronous ops, without an event per op.
//
// Synchronous ops run on the caller's stream and return a Work without an
// event, so the lean path may cost only one cudaEventRecord. Ops are grouped
// into spans of at most `span` of host time; each span owns one event,
// re-recorded after every op in it. For the oldest unfinished span:
//   - its event is not complete, so an op enqueued at or before its last
//     record is unfinished: the oldest unfinished op is at least
//     `now - lastRecord` old (the lower bound a timeout is judged by, so a
//     healthy queue of any depth is never called stuck);
//   - the span before it completed, so that op was enqueued at or after the
//     span's start, at most `span` before its last record: a stuck op is
//     reported at most `span` after its timeout.
// One caller thread notes ops (the backend's); one watchdog thread reads.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "backend/event_pool.h"

namespace nccl_core {

class SyncOpTimeline {
 public:
  using Clock = std::chrono::steady_clock;

  struct Unfinished {
    const char* name; // the span's first op: the oldest not known to be done
    uint64_t seq;
    Clock::duration age; // lower bound of the oldest unfinished op's age
  };

  SyncOpTimeline(std::shared_ptr<EventPool> events, Clock::duration span);
  SyncOpTimeline(const SyncOpTimeline&) = delete;
  SyncOpTimeline& operator=(const SyncOpTimeline&) = delete;

  // Caller thread: op `seq` was just enqueued on `stream`.
  void note(cudaStream_t stream, const char* name, uint64_t seq);

  // Watchdog thread: drops finished spans; the oldest unfinished op, if any.
  std::optional<Unfinished> oldestUnfinished(Clock::time_point now);

 private:
  struct Span {
    EventPool::Event event;
    Clock::time_point start;
    const char* firstName;
    uint64_t firstSeq;
    std::atomic<Clock::rep> lastRecord; // time_since_epoch of the last record
  };

  // Whether `span`'s event completed; throws on a CUDA error.
  static bool finished(const Span& span);

  const std::shared_ptr<EventPool> events_;
  const Clock::duration span_;
  std::mutex mutex_; // guards spans_' shape, not the open span's fields
  std::deque<std::unique_ptr<Span>> spans_;
  Span* open_ = nullptr; // caller thread only: spans_.back()
};

} // namespace nccl_core

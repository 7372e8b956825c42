// The ages of a group's synchronous ops, without an event per op.
//
// Synchronous ops run on the caller's stream and return a Work without an
// event, so the lean path may cost only one cudaEventRecord. Ops are grouped
// into spans of at most `span` of host time; each span owns one event,
// re-recorded after every op in it. For the oldest unfinished span:
//   - its event is not complete, so an op enqueued at or before its last
//     record is unfinished: the oldest unfinished op is at least
//     `now - lastRecord` old (the lower bound a timeout is judged by, so no
//     op is called stuck before it has been unfinished for the timeout,
//     however many ops are queued behind or ahead of it);
//   - the span before it completed, so that op was enqueued at or after the
//     span's start, at most `span` before its last record: a stuck op is
//     reported at most `span` after its timeout.
// One caller thread notes ops (the backend's); one watchdog thread reads.
// The event source is a parameter so that CPU tests can drive the same logic
// with events they complete themselves (csrc/testing/bindings.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/runtime/event_pool.h"

namespace nccl_core {

// What the watchdog says of a synchronous op besides its name and sequence
// number: the peers of a one-sided op. Plain data of fixed size, so that
// noting an op never allocates; collectives note none.
struct SyncOpDetail {
  static constexpr int kPeersShown = 4;
  std::array<int, kPeersShown> peers{};
  int peerCount = 0; // every peer, shown or not
  // The op waits for its peers (wait_signal). Such an op opens a span of its
  // own, so that a wait whose signals never come is reported by name and
  // sequence number, not as an earlier op of its span; only waits noted
  // within kWaitBurst of the one that opened a span share it, which bounds
  // the spans (and events) of a loop of waits.
  bool waitsOnPeers = false;

  void addPeer(int peer) {
    if (peerCount < kPeersShown) {
      peers[peerCount] = peer;
    }
    ++peerCount;
  }
};

// ", peer 1" or ", peers 1, 2, 3, 4 and 2 more"; empty without peers.
std::string describePeers(const SyncOpDetail& detail);

// `Events` provides: a movable `Event`; `Event acquire()`;
// `void record(const Event&, cudaStream_t)`; `bool finished(const Event&)`.
template <typename Events>
class BasicSyncOpTimeline {
 public:
  using Clock = std::chrono::steady_clock;

  struct Unfinished {
    const char* name; // the span's first op: the oldest not known to be done
    uint64_t seq;
    Clock::duration age; // lower bound of the oldest unfinished op's age
    SyncOpDetail detail; // that op's
  };

  // See SyncOpDetail::waitsOnPeers.
  static constexpr Clock::duration kWaitBurst = std::chrono::milliseconds(1);

  BasicSyncOpTimeline(Events events, Clock::duration span)
      : events_(std::move(events)), span_(span) {}
  BasicSyncOpTimeline(const BasicSyncOpTimeline&) = delete;
  BasicSyncOpTimeline& operator=(const BasicSyncOpTimeline&) = delete;

  // Caller thread: op `seq` was enqueued on `stream` at `now`; `detail`, if
  // any, is reported with it.
  void note(
      cudaStream_t stream,
      const char* name,
      uint64_t seq,
      Clock::time_point now,
      const SyncOpDetail* detail = nullptr) {
    if (open_ == nullptr || now - open_->start >= span_ ||
        (detail != nullptr && detail->waitsOnPeers &&
         !(open_->firstDetail.waitsOnPeers &&
           now - open_->start < kWaitBurst))) {
      // Recorded before it is published: a reader never sees a span without
      // this op's record and time.
      auto span = std::make_unique<Span>();
      span->event = events_.acquire();
      span->start = now;
      span->firstName = name;
      span->firstSeq = seq;
      if (detail != nullptr) {
        span->firstDetail = *detail;
      }
      span->lastRecord.store(now.time_since_epoch().count());
      events_.record(span->event, stream);
      open_ = span.get();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        spans_.push_back(std::move(span));
      }
      lastNoted_.store(seq, std::memory_order_release);
      return;
    }
    // The time goes first: a reader that sees this record then reads a time
    // no earlier than it, so the age it derives is never too large.
    open_->lastRecord.store(
        now.time_since_epoch().count(), std::memory_order_release);
    events_.record(open_->event, stream);
    lastNoted_.store(seq, std::memory_order_release);
  }

  // Watchdog thread: drops finished spans; the oldest unfinished op, if any.
  // Also updates finishedBefore().
  std::optional<Unfinished> oldestUnfinished(Clock::time_point now) {
    // Read before the events: an op noted up to here is recorded in them.
    const uint64_t noted = lastNoted_.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> lock(mutex_);
    while (!spans_.empty()) {
      const Span& oldest = *spans_.front();
      const bool open = spans_.size() == 1;
      if (events_.finished(oldest.event)) {
        if (open) {
          finishedBefore_ = noted + 1;
          return std::nullopt; // the caller may still record into it
        }
        spans_.pop_front(); // closed: no op is recorded into it any more
        continue;
      }
      finishedBefore_ = oldest.firstSeq;
      const Clock::time_point last(
          Clock::duration(oldest.lastRecord.load(std::memory_order_acquire)));
      return Unfinished{
          oldest.firstName,
          oldest.firstSeq,
          now > last ? now - last : Clock::duration::zero(),
          oldest.firstDetail};
    }
    finishedBefore_ = noted + 1;
    return std::nullopt;
  }

  // Watchdog thread: every op noted with a lower sequence number finished,
  // as the last oldestUnfinished() found.
  uint64_t finishedBefore() const {
    return finishedBefore_.load(std::memory_order_relaxed);
  }

  // The newest op noted.
  uint64_t lastNoted() const {
    return lastNoted_.load(std::memory_order_acquire);
  }

  size_t spanCount() {
    std::lock_guard<std::mutex> lock(mutex_);
    return spans_.size();
  }

 private:
  struct Span {
    typename Events::Event event;
    Clock::time_point start;
    const char* firstName;
    uint64_t firstSeq;
    SyncOpDetail firstDetail;
    std::atomic<Clock::rep> lastRecord; // time_since_epoch of the last record
  };

  Events events_;
  const Clock::duration span_;
  std::mutex mutex_; // guards spans_' shape, not the open span's fields
  std::deque<std::unique_ptr<Span>> spans_;
  std::atomic<uint64_t> lastNoted_{0}; // the newest op noted
  std::atomic<uint64_t> finishedBefore_{0};
  Span* open_ = nullptr; // caller thread only: spans_.back()
};

// CUDA events from the group's pool.
struct CudaSpanEvents {
  using Event = EventPool::Event;
  std::shared_ptr<EventPool> pool;

  Event acquire() {
    return pool->acquire();
  }
  static void record(const Event& event, cudaStream_t stream);
  // Throws on a CUDA error.
  static bool finished(const Event& event);
};

using SyncOpTimeline = BasicSyncOpTimeline<CudaSpanEvents>;

} // namespace nccl_core

#include "backend/sync_ops.h"

#include <c10/cuda/CUDAException.h>

namespace nccl_core {

SyncOpTimeline::SyncOpTimeline(
    std::shared_ptr<EventPool> events,
    Clock::duration span)
    : events_(std::move(events)), span_(span) {}

void SyncOpTimeline::note(cudaStream_t stream, const char* name, uint64_t seq) {
  const Clock::time_point now = Clock::now();
  if (open_ == nullptr || now - open_->start >= span_) {
    auto span = std::make_unique<Span>();
    span->event = events_->acquire();
    span->start = now;
    span->firstName = name;
    span->firstSeq = seq;
    open_ = span.get();
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.push_back(std::move(span));
  }
  // The time goes first: a reader that sees this record then reads a time no
  // earlier than it, so the age it derives is never too large.
  open_->lastRecord.store(
      now.time_since_epoch().count(), std::memory_order_release);
  C10_CUDA_CHECK(cudaEventRecord(open_->event.get(), stream));
}

bool SyncOpTimeline::finished(const Span& span) {
  const cudaError_t status = cudaEventQuery(span.event.get());
  if (status == cudaErrorNotReady) {
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

std::optional<SyncOpTimeline::Unfinished>
SyncOpTimeline::oldestUnfinished(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!spans_.empty()) {
    const Span& oldest = *spans_.front();
    const bool open = spans_.size() == 1;
    if (finished(oldest)) {
      if (open) {
        return std::nullopt; // the caller may still record into it
      }
      spans_.pop_front(); // closed: no op is recorded into it any more
      continue;
    }
    const Clock::time_point last(
        Clock::duration(oldest.lastRecord.load(std::memory_order_acquire)));
    return Unfinished{
        oldest.firstName,
        oldest.firstSeq,
        now > last ? now - last : Clock::duration::zero()};
  }
  return std::nullopt;
}

} // namespace nccl_core

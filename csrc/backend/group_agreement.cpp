#include "backend/group_agreement.h"

#include <c10/util/StringUtil.h>

#include <numeric>

#include "backend/runtime/meetings.h"

namespace nccl_core {

GroupAgreement::GroupAgreement(
    c10::intrusive_ptr<c10d::Store> store,
    int rank,
    int size,
    const std::string& name,
    const std::atomic<std::chrono::milliseconds>& timeout,
    std::shared_ptr<const FailureState> failure)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      label_(c10::str("group '", name, "'")),
      timeout_(timeout),
      failure_(std::move(failure)),
      incarnation_(
          store_->add(c10::str("nccl_core/incarnations/rank", rank), 1)) {}

std::string GroupAgreement::key(const std::string& name) const {
  return c10::str("nccl_core/", incarnation_, "/", name);
}

std::string GroupAgreement::next(const std::string& purpose) {
  const std::lock_guard<std::mutex> lock(meetingsMutex_);
  return c10::str(purpose, "/", ++meetings_[purpose]);
}

int64_t GroupAgreement::meetEveryRank(const std::string& name, int64_t count) {
  std::vector<int> ranks(size_);
  std::iota(ranks.begin(), ranks.end(), 0);
  return meet(
      {*store_,
       key(name),
       timeout_.load(),
       label_,
       [failure = failure_] { return failure->failed(); }},
      rank_,
      ranks,
      count);
}

int64_t GroupAgreement::meetAmong(
    const std::string& name,
    const std::vector<int>& ranks,
    int64_t count) {
  return meet(
      {*store_, key(name), timeout_.load(), label_}, rank_, ranks, count);
}

int64_t GroupAgreement::meetNext(const std::string& purpose, int64_t vote) {
  int64_t meeting = 0;
  {
    const std::lock_guard<std::mutex> lock(meetingsMutex_);
    meeting = ++meetings_[purpose];
  }
  const auto name = [&](int64_t n) { return c10::str(purpose, "/", n); };
  const int64_t tally = meetEveryRank(name(meeting), vote);
  if (rank_ == 0 && meeting > 1) {
    nccl_core::leaveRendezvous(*store_, key(name(meeting - 1)), size_);
  }
  return tally;
}

ncclUniqueId GroupAgreement::rendezvous(
    const std::string& purpose,
    const std::string& label,
    int rank,
    int size,
    const std::function<bool()>& abandon,
    const std::function<ncclUniqueId()>& makeId) {
  return nccl_core::rendezvous(
      {*store_, key(purpose), timeout_.load(), label, abandon},
      rank,
      size,
      makeId);
}

void GroupAgreement::leaveRendezvous(const std::string& purpose, int size) {
  nccl_core::leaveRendezvous(*store_, key(purpose), size);
}

void GroupAgreement::giveUp(const std::string& name) {
  giveUpMeeting(*store_, key(name));
}

} // namespace nccl_core

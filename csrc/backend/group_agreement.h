// Where a group's ranks agree, in the store they meet in (runtime/
// meetings.h): store keys of their own for each incarnation of the group,
// meetings of every rank bounded by the group's timeout and given up once the
// group fails, and numbered meetings for what recurs (suspend, resume, window
// upgrade votes, shrink), so that each has keys of its own. The backend's
// ops never touch the store; only these agreements and the watchdog's abort
// notice do.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nccl.h>

#include "backend/runtime/failure.h"

namespace nccl_core {

class GroupAgreement {
 public:
  // Rank `rank` of `size` in group `name`, meeting in `store` for up to
  // `timeout` (read at each meeting: set_timeout changes it), giving up once
  // `failure` is set. Counts this incarnation in the store, as every rank of
  // the group does: each gets the same number.
  GroupAgreement(
      c10::intrusive_ptr<c10d::Store> store,
      int rank,
      int size,
      const std::string& name,
      const std::atomic<std::chrono::milliseconds>& timeout,
      std::shared_ptr<const FailureState> failure);
  GroupAgreement(const GroupAgreement&) = delete;
  GroupAgreement& operator=(const GroupAgreement&) = delete;

  const c10::intrusive_ptr<c10d::Store>& store() const {
    return store_;
  }
  // A key of this incarnation: a group re-created under the same name
  // (re-init in one process) never reads the previous one's.
  std::string key(const std::string& name) const;
  // The key of the next meeting for `purpose` ("shrink/3"). A purpose is
  // numbered by next() or by meetNext(), never both.
  std::string next(const std::string& purpose);

  // Every rank meets under `key(name)`, adding `count` to the tally it
  // returns.
  int64_t meetEveryRank(const std::string& name, int64_t count);
  // `ranks` (numbers in the group) meet under `key(name)`, not given up
  // once the group fails (a shrink's meeting is how the survivors learn of
  // a failure).
  int64_t meetAmong(
      const std::string& name,
      const std::vector<int>& ranks,
      int64_t count);
  // The next meeting of every rank for `purpose`: its tally; rank 0 then
  // removes the keys of the meeting before, which every rank has left.
  int64_t meetNext(const std::string& purpose, int64_t vote);

  // The ranks 0 to `size` - 1 of the communicator `label` names meet under
  // `key(purpose)` before it is made and get its unique id, made by rank 0
  // (meetings.h); the meeting is given up once `abandon` holds.
  ncclUniqueId rendezvous(
      const std::string& purpose,
      const std::string& label,
      int rank,
      int size,
      const std::function<bool()>& abandon,
      const std::function<ncclUniqueId()>& makeId);
  // Rank 0, once that communicator exists: removes the meeting's keys.
  void leaveRendezvous(const std::string& purpose, int size);
  // Gives up the meeting under `key(name)` for every rank waiting in it.
  void giveUp(const std::string& name);

 private:
  const c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int size_;
  const std::string label_; // "group 'g'"
  const std::atomic<std::chrono::milliseconds>& timeout_;
  const std::shared_ptr<const FailureState> failure_;
  const int64_t incarnation_;
  std::mutex meetingsMutex_; // window upgrades vote on another thread
  std::map<std::string, int64_t> meetings_; // per purpose, held so far
};

} // namespace nccl_core

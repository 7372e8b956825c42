// How the ranks of a group meet in its store before a collective host call
// that NCCL would not bound: a communicator's initialization (NCCL's
// bootstrap waits for a rank that never comes for ever, and a blocking
// communicator cannot be aborted before its handle exists), or the choice
// of how to shrink. The group's timeout bounds the meeting, and a rank that
// never came is named.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace nccl_core {

// Where the ranks of a group meet: under `prefix` in `store`, for up to
// `timeout`; `label` names the group in errors. A rank whose `abandon` turns
// true while it waits (its group was aborted) gives the meeting up for every
// rank, unless it was decided already.
struct Meeting {
  c10d::Store& store;
  std::string prefix;
  std::chrono::milliseconds timeout;
  std::string label;
  std::function<bool()> abandon = {};
};

// Rank `rank` comes to the meeting of `ranks` (their numbers in the store's
// group) and adds `count` to its tally. Once every one of them has come
// within the timeout: the tally. Otherwise DistBackendError naming those that
// did not come. Every rank gets the same outcome, whenever it comes: the
// first rank to decide (all came, or its timeout passed) records the decision
// and the others follow it, so a late rank finds the meeting given up rather
// than going on alone. Each rank makes O(1) store calls per poll, whatever
// the group's size.
int64_t
meet(const Meeting& at, int rank, const std::vector<int>& ranks, int64_t count);

// A rank's count at a meeting of `size` ranks that choose between two ways,
// or neither, and must all choose alike: 0 for neither, 1 for the first way,
// size + 1 for the second. No mix of counts sums to `vote` * size but every
// rank voting `vote` (`unanimous`).
inline int64_t twoWayVote(bool can, bool second, int64_t size) {
  return !can ? 0 : second ? size + 1 : 1;
}
inline bool unanimous(int64_t tally, int64_t vote, int64_t size) {
  return vote != 0 && tally == vote * size;
}

// Records the meeting under `prefix` given up, unless it was decided already:
// the ranks waiting in it, and those that come later, get DistBackendError.
void giveUpMeeting(c10d::Store& store, const std::string& prefix);

// The meeting of ranks 0 to `size` - 1 before a new communicator; then its
// unique id, made by rank 0 once the meeting went ahead (`makeId`:
// Communicator::uniqueId, or growId for a grow).
ncclUniqueId rendezvous(
    const Meeting& at,
    int rank,
    int size,
    const std::function<ncclUniqueId()>& makeId);

// Rank 0, once the communicator exists (every rank is past the meeting):
// removes its keys from the store.
void leaveRendezvous(c10d::Store& store, const std::string& prefix, int size);

} // namespace nccl_core

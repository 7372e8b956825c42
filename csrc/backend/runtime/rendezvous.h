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

// Rank `rank` comes to the meeting `prefix` of `ranks` (their numbers in the
// store's group) and adds `count` to its tally. Once every one of them has
// come within `timeout`: the tally. Otherwise DistBackendError naming those
// that did not come (`label` names the group). Every rank gets the same
// outcome, whenever it comes: the first rank to decide (all came, or its
// timeout passed) records the decision and the others follow it, so a late
// rank finds the meeting given up rather than going on alone. A rank whose
// `abandon` turns true while it waits (its group was aborted) gives the
// meeting up for every rank, unless it was decided already. Each rank makes
// O(1) store calls per poll, whatever the group's size.
int64_t meet(
    c10d::Store& store,
    const std::string& prefix,
    int rank,
    const std::vector<int>& ranks,
    int64_t count,
    std::chrono::milliseconds timeout,
    const std::string& label,
    const std::function<bool()>& abandon = {});

// The meeting of ranks 0 to `size` - 1 before a new communicator; then its
// unique id, made by rank 0 once the meeting went ahead (`makeId`:
// Communicator::uniqueId, or growId for a grow).
ncclUniqueId rendezvous(
    c10d::Store& store,
    const std::string& prefix,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& label,
    const std::function<ncclUniqueId()>& makeId,
    const std::function<bool()>& abandon = {});

// Rank 0, once the communicator exists (every rank is past the meeting):
// removes its keys from the store.
void leaveRendezvous(c10d::Store& store, const std::string& prefix, int size);

} // namespace nccl_core

// How the ranks of a new communicator meet before NCCL's initialization: in
// the group's store, bounded by the group's timeout. NCCL's bootstrap waits
// without bound for a rank that never comes, and a blocking communicator
// cannot be aborted before its handle exists; a rank that never came is
// named here instead.
#pragma once

#include <chrono>
#include <string>

#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace nccl_core {

// Once each of the `size` ranks has called this with the same `prefix`
// within `timeout`: the unique id of their communicator (made by rank 0).
// Otherwise DistBackendError naming the ranks that did not come (`label`
// names the group).
ncclUniqueId rendezvous(
    c10d::Store& store,
    const std::string& prefix,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& label);

// Rank 0, once the communicator exists (every rank read its keys): removes
// them from the store.
void leaveRendezvous(c10d::Store& store, const std::string& prefix, int size);

} // namespace nccl_core

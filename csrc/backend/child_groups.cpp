// Groups made from a group: split (torch.distributed.split_group, new_group
// with a split parent) through ncclCommSplit, and shrink
// (torch.distributed.shrink_group) through ncclCommShrink. Each child owns
// its communicator: destroying the parent, as shrink_group does at once,
// leaves it working.
#include <algorithm>
#include <set>

#include "backend/backend.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {
// The same value on every member of a split, different across splits.
int splitColor(const std::vector<int>& ranks) {
  uint32_t hash = 2166136261u; // FNV-1a
  for (int rank : ranks) {
    hash = (hash ^ static_cast<uint32_t>(rank)) * 16777619u;
  }
  return static_cast<int>(hash & 0x7fffffff);
}
} // namespace

c10::intrusive_ptr<NcclCoreBackend> NcclCoreBackend::child(
    const c10::intrusive_ptr<c10d::Store>& store,
    std::shared_ptr<Communicator> comm,
    std::string name,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts,
    const std::vector<int>& members) {
  const std::chrono::milliseconds timeout =
      opts && opts->timeout.count() > 0 ? opts->timeout : timeout_.load();
  const int rank = comm->rank();
  const int size = comm->size();
  std::vector<int64_t> globalRanks;
  for (int member : members) {
    globalRanks.push_back(globalRanks_[member]);
  }
  return c10::make_intrusive<NcclCoreBackend>(
      Membership{store, rank, size, std::move(name)},
      std::make_shared<NcclCoreOptions>(*options_),
      timeout,
      std::move(comm),
      std::move(globalRanks));
}

c10::intrusive_ptr<c10d::Backend> NcclCoreBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  Communicator& parent = communicator(deviceForOpWithoutTensors({}));
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  const bool member = me != ranks.end();
  std::string name = opts ? opts->group_name : *groupName_ + ":split";
  // Every rank of the parent takes part; non-members pass no color.
  auto comm = parent.split(
      member ? splitColor(ranks) : -1,
      member ? static_cast<int>(me - ranks.begin()) : 0,
      options_->toNcclConfig(),
      c10::str("group '", name, "'"));
  if (!comm) {
    return nullptr;
  }
  return child(store, std::move(comm), std::move(name), opts, ranks);
}

std::vector<int> NcclCoreBackend::checkedExclusions(
    const std::vector<int64_t>& ranksToExclude,
    int shrinkFlags) const {
  constexpr const char* kOp = "shrink";
  NCCL_CORE_CHECK_ARG(
      shrinkFlags == NCCL_SHRINK_DEFAULT || shrinkFlags == NCCL_SHRINK_ABORT,
      kOp,
      "shrink_flags must be SHRINK_DEFAULT (",
      NCCL_SHRINK_DEFAULT,
      ") or SHRINK_ABORT (",
      NCCL_SHRINK_ABORT,
      "), got ",
      shrinkFlags);
  NCCL_CORE_CHECK_ARG(
      !ranksToExclude.empty(),
      kOp,
      "ranks_to_exclude must name at least one rank of group '",
      *groupName_,
      "'");
  std::set<int64_t> seen;
  for (int64_t rank : ranksToExclude) {
    NCCL_CORE_CHECK_ARG(
        rank >= 0 && rank < getSize(),
        kOp,
        "rank ",
        rank,
        " in ranks_to_exclude is not a rank of group '",
        *groupName_,
        "' (size ",
        getSize(),
        ")");
    NCCL_CORE_CHECK_ARG(
        seen.insert(rank).second,
        kOp,
        "rank ",
        rank,
        " appears twice in ranks_to_exclude");
    // NCCL's contract: excluded ranks do not call ncclCommShrink.
    NCCL_CORE_CHECK_ARG(
        rank != getRank(),
        kOp,
        "rank ",
        rank,
        " is excluded from group '",
        *groupName_,
        "' and must not call shrink; only the ranks that stay do");
  }
  return std::vector<int>(seen.begin(), seen.end());
}

c10::intrusive_ptr<c10d::Backend> NcclCoreBackend::reform(
    const std::vector<int>& members,
    const std::string& meeting,
    std::string name,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // A rank that had not seen the group fail ends its ops on the dead peer.
  teardownWithoutFinalizing(
      c10::str(
          "nccl_core group '",
          *groupName_,
          "' was shrunk after a rank of it failed"));
  const int rank = static_cast<int>(
      std::find(members.begin(), members.end(), getRank()) - members.begin());
  auto comm = newCommunicator(
      meeting + "/reform",
      rank,
      static_cast<int>(members.size()),
      deviceForOpWithoutTensors({}).index(),
      name);
  return child(
      agreement_.store(), std::move(comm), std::move(name), opts, members);
}

c10::intrusive_ptr<c10d::Backend> NcclCoreBackend::shrink(
    const std::vector<int64_t>& ranksToExclude,
    int shrinkFlags,
    const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) {
  std::vector<int> excluded = checkedExclusions(ranksToExclude, shrinkFlags);
  std::vector<int> members;
  for (int rank = 0; rank < getSize(); ++rank) {
    if (!std::binary_search(excluded.begin(), excluded.end(), rank)) {
      members.push_back(rank);
    }
  }
  std::string name = optsOverride && !optsOverride->group_name.empty()
                         ? optsOverride->group_name
                         : *groupName_ + ":shrunk";
  // The ranks that stay agree on how: a rank idle when a peer died may not
  // have seen the group fail yet.
  const std::string meeting = agreement_.next("shrink");
  const int64_t failed =
      agreement_.meetAmong(meeting, members, failure_->failed() ? 1 : 0);
  if (failed > 0) {
    // The failed group's communicator was aborted with it, and NCCL could not
    // have shrunk it anyway: after a peer's death, ncclCommShrink's
    // ncclCommEnsureReady hands back the error the parent's proxy recorded,
    // SHRINK_ABORT or not (NCCL 2.28-2.30, init.cc). The ranks that stay make
    // a communicator of their own instead, as at init, whatever the flags.
    return reform(members, meeting, std::move(name), optsOverride);
  }
  // Making the communicator now would wait for the excluded ranks.
  NCCL_CORE_CHECK_STATE(
      comm_ != nullptr,
      "shrink",
      "group '",
      *groupName_,
      "' has no communicator yet; shrink works on one that ran an op or was "
      "connected eagerly (init_process_group(device_id=...))");
  Communicator& parent = communicator(deviceForOpWithoutTensors({}));
  const bool endsOps = shrinkFlags == NCCL_SHRINK_ABORT;
  const std::string ended = c10::str(
      "nccl_core group '",
      *groupName_,
      "' was shrunk with SHRINK_ABORT, which ended its ops in flight");
  if (endsOps) {
    // NCCL ends the ops in flight here: the watchdog must not take that for
    // a failure and tell the peers, whose own shrink would then fail; and
    // their Work fails first, as their events complete without the op.
    const std::lock_guard<std::mutex> lock(initMutex_);
    watchdog_->stop();
    watchdog_->failWork(ended);
  }
  std::shared_ptr<Communicator> comm;
  try {
    comm = parent.shrink(
        std::move(excluded),
        shrinkFlags,
        options_->toNcclConfig(),
        c10::str("group '", name, "'"));
  } catch (...) {
    if (endsOps) {
      teardownWithoutFinalizing(ended);
    }
    throw;
  }
  if (endsOps) {
    // Frees the parent's communicator; an excluded rank destroying the
    // group learns that this one never finalizes it.
    teardownWithoutFinalizing(ended);
  }
  return child(
      agreement_.store(),
      std::move(comm),
      std::move(name),
      optsOverride,
      members);
}

} // namespace nccl_core

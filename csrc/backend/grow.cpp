// Elastic grow: a group and processes that join it make a larger group
// through NCCL's ncclCommGrow (NCCL >= 2.29), the group's ranks keeping
// their numbers. NCCL leaves it to the caller to hand the new processes the
// id that rank 0 takes (ncclCommGetUniqueId): they find it in the new group's
// store, after a meeting of every rank of it that the group's timeout bounds,
// since NCCL's bootstrap would wait for a missing process for ever.
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "backend/runtime/meetings.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

constexpr const char* kPlanKey = "nccl_core/grow/plan";
constexpr const char* kMeeting = "nccl_core/grow/meeting";

std::vector<uint8_t> bytesOf(const std::string& text) {
  return {text.begin(), text.end()};
}

// Whether this is the first time `rank` takes part in a grow under `store`:
// a second grow under one store would meet the first one's keys.
bool firstTime(c10d::Store& store, const char* as, int rank) {
  return store.add(c10::str("nccl_core/grow/", as, "/", rank), 1) == 1;
}

// What rank 0 of a growing group publishes (kPlanKey) for the joining
// processes: the group's size, the size it grows to, and its op timeout,
// which the grown group keeps on every rank.
struct Plan {
  int oldSize = 0;
  int newSize = 0;
  int64_t timeoutMs = 0;
};

// The growing group's plan, or DistBackendError once `timeout` passed
// without one.
Plan awaitPlan(
    c10d::Store& store,
    std::chrono::milliseconds timeout,
    const std::string& label) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Polled, as the rendezvous does: a waiting client holds its lock.
  while (!store.check({kPlanKey})) {
    if (std::chrono::steady_clock::now() > deadline) {
      C10_THROW_ERROR(
          DistBackendError,
          c10::str(
              "nccl_core join: no group grew into ",
              label,
              " within the timeout (",
              timeout.count(),
              " ms): its ranks call torch_nccl_core.grow_group with the same "
              "key"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<uint8_t> text = store.get(kPlanKey);
  std::istringstream fields(std::string(text.begin(), text.end()));
  Plan plan;
  fields >> plan.oldSize >> plan.newSize >> plan.timeoutMs;
  return plan;
}

} // namespace

c10::intrusive_ptr<NcclCoreBackend> NcclCoreBackend::grow(
    const c10::intrusive_ptr<c10d::Store>& store,
    int newSize,
    std::string name) {
  constexpr const char* kOp = "grow";
  Communicator::requireGrowSupport(*options_->api, kOp);
  NCCL_CORE_CHECK_ARG(
      newSize > getSize(),
      kOp,
      "size must exceed the ",
      getSize(),
      " ranks of group '",
      *groupName_,
      "', got ",
      newSize);
  refuseInsideCoalescing(kOp);
  failure_->raiseIfFailed(); // before the key is spent
  NCCL_CORE_CHECK_ARG(
      firstTime(*store, "members", getRank()),
      kOp,
      "a grow into '",
      name,
      "' ran before: each grow needs a key of its own");
  Communicator& parent = communicator(deviceForOpWithoutTensors({}));
  const std::string label = c10::str("group '", name, "'");
  const std::chrono::milliseconds timeout = timeout_.load();
  if (getRank() == 0) {
    store->set(
        kPlanKey,
        bytesOf(c10::str(getSize(), " ", newSize, " ", timeout.count())));
  }
  const ncclUniqueId id = rendezvous(
      {*store, kMeeting, timeout, label, [this] { return failure_->failed(); }},
      getRank(),
      newSize,
      [&parent] { return parent.growId(); });
  std::shared_ptr<Communicator> comm;
  try {
    comm = parent.grow(
        newSize,
        getRank() == 0 ? &id : nullptr, // NCCL hands it to the others
        options_->toNcclConfig(),
        label);
  } catch (const std::exception& e) {
    // Past ncclCommGetUniqueId the ranks' NCCL grow state may differ (its
    // child counts): this group cannot grow again, and says so.
    failure_->set(
        c10::str(
            "nccl_core group '",
            *groupName_,
            "' failed to grow into ",
            label,
            ": ",
            e.what(),
            "; shrink it or make it anew"));
    throw;
  }
  if (getRank() == 0) {
    // Every rank is in the new communicator: past the meeting.
    leaveRendezvous(*store, kMeeting, newSize);
  }
  return c10::make_intrusive<NcclCoreBackend>(
      Membership{store, getRank(), newSize, std::move(name)},
      std::make_shared<NcclCoreOptions>(*options_),
      timeout,
      std::move(comm));
}

c10::intrusive_ptr<NcclCoreBackend> NcclCoreBackend::join(
    Membership member,
    std::shared_ptr<const NcclCoreOptions> options,
    std::chrono::milliseconds timeout,
    int device) {
  constexpr const char* kOp = "join";
  c10d::Store& store = *member.store;
  const int rank = member.rank;
  const int size = member.size;
  Communicator::requireGrowSupport(*options->api, kOp);
  NCCL_CORE_CHECK_ARG(
      rank >= 0 && rank < size,
      kOp,
      "rank must lie in [0, ",
      size,
      "), got ",
      rank);
  const std::string label = c10::str("group '", member.name, "'");
  const Plan plan = awaitPlan(store, timeout, label);
  NCCL_CORE_CHECK_ARG(
      plan.newSize == size,
      kOp,
      "size ",
      size,
      " differs from the ",
      plan.newSize,
      " ranks the group grows to as ",
      label);
  const int oldSize = plan.oldSize;
  NCCL_CORE_CHECK_ARG(
      rank >= oldSize,
      kOp,
      "rank ",
      rank,
      " is a rank of the growing group already (ranks 0 to ",
      oldSize - 1,
      "); a joining process takes one of ranks ",
      oldSize,
      " to ",
      size - 1);
  NCCL_CORE_CHECK_ARG(
      firstTime(store, "joined", rank),
      kOp,
      "rank ",
      rank,
      " of ",
      label,
      " was taken by another joining process");
  // The group's timeout from here on, as on its other ranks.
  const std::chrono::milliseconds groupTimeout(plan.timeoutMs);
  // Never rank 0 (the growing group's): it makes no id.
  const ncclUniqueId id =
      rendezvous({store, kMeeting, groupTimeout, label}, rank, size, [] {
        return ncclUniqueId{};
      });
  auto comm = Communicator::create(
      size,
      rank,
      id,
      {options->api, device, options->toNcclConfig(), groupTimeout, label},
      nullptr,
      Communicator::Joining::Grow);
  return c10::make_intrusive<NcclCoreBackend>(
      std::move(member), std::move(options), groupTimeout, std::move(comm));
}

} // namespace nccl_core

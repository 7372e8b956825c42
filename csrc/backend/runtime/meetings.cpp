#include "backend/runtime/meetings.h"

#include <cstring>
#include <numeric>
#include <thread>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {
// Polled, not waited for: c10d's TCPStore client holds its lock through a
// wait, and every group on the default store shares that client (their
// watchdogs read their abort keys through it).
constexpr std::chrono::milliseconds kMeetingPollInterval{10};
const std::string kGo = "go";
const std::string kGivenUp = "given up";

std::string arrivedKey(const std::string& prefix, int rank) {
  return c10::str(prefix, "/arrived/", rank);
}

std::string arrivalsKey(const std::string& prefix) {
  return prefix + "/arrivals";
}

std::string tallyKey(const std::string& prefix) {
  return prefix + "/tally";
}

std::string decisionKey(const std::string& prefix) {
  return prefix + "/decision";
}

std::string idKey(const std::string& prefix) {
  return prefix + "/unique_id";
}

// Why a meeting of `ranks` did not go ahead, as rank `rank` saw it.
std::string whyNotMet(
    const Meeting& at,
    int rank,
    const std::vector<int>& ranks,
    bool abandoned,
    bool decidedElsewhere) {
  const int64_t timeoutMs = at.timeout.count();
  std::vector<int> missing;
  for (int r : ranks) {
    if (!at.store.check({arrivedKey(at.prefix, r)})) {
      missing.push_back(r);
    }
  }
  const std::string ranksMissing = c10::Join(", ", missing);
  if (abandoned) {
    return c10::str(
        "rank ",
        rank,
        " of ",
        at.label,
        " gave up waiting for rank(s) ",
        ranksMissing,
        ": the group was aborted");
  }
  if (missing.empty()) {
    return c10::str(
        "rank ",
        rank,
        " of ",
        at.label,
        " came after the other ranks had given up waiting for it (the "
        "group's timeout, ",
        timeoutMs,
        " ms)");
  }
  return c10::str(
      "rank(s) ",
      ranksMissing,
      " of ",
      at.label,
      decidedElsewhere
          ? c10::str(
                " did not come, and another rank gave the meeting up (the "
                "group's timeout is ",
                timeoutMs,
                " ms)")
          : c10::str(
                " did not come within the group's timeout (",
                timeoutMs,
                " ms); rank ",
                rank,
                " waited for them"));
}

} // namespace

int64_t meet(
    const Meeting& at,
    int rank,
    const std::vector<int>& ranks,
    int64_t count) {
  c10d::Store& store = at.store;
  const std::string& prefix = at.prefix;
  const std::chrono::milliseconds timeout = at.timeout;
  store.set(arrivedKey(prefix, rank), std::vector<uint8_t>{1}); // names it
  store.add(tallyKey(prefix), count);
  const auto size = static_cast<int64_t>(ranks.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool everyone = store.add(arrivalsKey(prefix), 1) >= size;
  bool abandoned = false;
  bool decidedElsewhere = false;
  while (!everyone && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(kMeetingPollInterval);
    abandoned = at.abandon && at.abandon();
    decidedElsewhere = !abandoned && store.check({decisionKey(prefix)});
    if (abandoned || decidedElsewhere) {
      break;
    }
    everyone = store.add(arrivalsKey(prefix), 0) >= size;
  }
  // The rank that decides "go" writes the tally into the decision (every
  // rank added its count before it came): each rank reads the outcome in one
  // call, which a store gone right after cannot split.
  const std::string proposal =
      everyone ? c10::str(kGo, ":", store.add(tallyKey(prefix), 0)) : kGivenUp;
  const std::vector<uint8_t> decided = store.compareSet(
      decisionKey(prefix),
      std::vector<uint8_t>{},
      std::vector<uint8_t>(proposal.begin(), proposal.end()));
  const std::string decision(decided.begin(), decided.end());
  if (decision.rfind(kGo + ":", 0) != 0) {
    C10_THROW_ERROR(
        DistBackendError,
        "nccl_core: " +
            whyNotMet(at, rank, ranks, abandoned, decidedElsewhere));
  }
  return std::stoll(decision.substr(kGo.size() + 1));
}

void giveUpMeeting(c10d::Store& store, const std::string& prefix) {
  store.compareSet(
      decisionKey(prefix),
      std::vector<uint8_t>{},
      std::vector<uint8_t>(kGivenUp.begin(), kGivenUp.end()));
}

ncclUniqueId rendezvous(
    const Meeting& at,
    int rank,
    int size,
    const std::function<ncclUniqueId()>& makeId) {
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  meet(at, rank, ranks, 0);
  c10d::Store& store = at.store;
  const std::string idAt = idKey(at.prefix);
  ncclUniqueId id;
  if (rank == 0) { // only now: an id made for a meeting given up would leave
                   // NCCL's bootstrap root waiting on rank 0
    try {
      id = makeId();
    } catch (const std::exception& e) {
      // The others wait for the id: they learn why none comes. Never the
      // length of an id.
      std::string why = e.what();
      why += why.size() == sizeof(id) ? "." : "";
      store.set(idAt, std::vector<uint8_t>(why.begin(), why.end()));
      throw;
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(idAt, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  } else {
    const std::vector<uint8_t> bytes = store.get(idAt);
    if (bytes.size() != sizeof(id)) {
      C10_THROW_ERROR(
          DistBackendError,
          c10::str(
              "nccl_core: rank 0 of ",
              at.label,
              " could not make NCCL's id: ",
              std::string(bytes.begin(), bytes.end())));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  return id;
}

void leaveRendezvous(c10d::Store& store, const std::string& prefix, int size) {
  try {
    for (const std::string& key :
         {idKey(prefix),
          decisionKey(prefix),
          arrivalsKey(prefix),
          tallyKey(prefix)}) {
      store.deleteKey(key);
    }
    for (int r = 0; r < size; ++r) {
      store.deleteKey(arrivedKey(prefix, r));
    }
  } catch (const std::exception& e) {
    LOG(INFO) << "[nccl_core] could not delete the keys of " << prefix << ": "
              << e.what();
  }
}

} // namespace nccl_core

#include "backend/rendezvous.h"

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
constexpr std::chrono::milliseconds kPollInterval{10};
const std::string kGo = "go";
const std::string kGivenUp = "given up";

std::string saidKey(const std::string& prefix, int rank) {
  return c10::str(prefix, "/said/", rank);
}

std::string decisionKey(const std::string& prefix) {
  return prefix + "/decision";
}

std::string idKey(const std::string& prefix) {
  return prefix + "/unique_id";
}

std::vector<uint8_t> bytesOf(const std::string& text) {
  return {text.begin(), text.end()};
}

std::string textOf(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}
} // namespace

std::vector<std::string> meet(
    c10d::Store& store,
    const std::string& prefix,
    int rank,
    const std::vector<int>& ranks,
    const std::string& mine,
    std::chrono::milliseconds timeout,
    const std::string& label) {
  store.set(saidKey(prefix, rank), bytesOf(mine));
  std::vector<std::string> keys;
  for (int r : ranks) {
    keys.push_back(saidKey(prefix, r));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool everyone = store.check(keys);
  while (!everyone && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(kPollInterval);
    everyone = store.check(keys);
  }
  const std::string decision = textOf(store.compareSet(
      decisionKey(prefix), {}, bytesOf(everyone ? kGo : kGivenUp)));
  if (decision != kGo) {
    std::vector<int> missing;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!store.check({keys[i]})) {
        missing.push_back(ranks[i]);
      }
    }
    C10_THROW_ERROR(
        DistBackendError,
        missing.empty()
            ? c10::str(
                  "nccl_core: rank ",
                  rank,
                  " of ",
                  label,
                  " came after the other ranks had given up waiting for it "
                  "(the group's timeout, ",
                  timeout.count(),
                  " ms)")
            : c10::str(
                  "nccl_core: rank(s) ",
                  c10::Join(", ", missing),
                  " of ",
                  label,
                  " did not come within the group's timeout (",
                  timeout.count(),
                  " ms); rank ",
                  rank,
                  " waited for them"));
  }
  std::vector<std::string> said;
  for (const auto& key : keys) {
    said.push_back(textOf(store.get(key)));
  }
  return said;
}

ncclUniqueId rendezvous(
    c10d::Store& store,
    const std::string& prefix,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& label) {
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  meet(store, prefix, rank, ranks, "", timeout, label);
  ncclUniqueId id;
  if (rank == 0) { // only now: an id made for a meeting given up would leave
                   // NCCL's bootstrap root waiting on rank 0
    NCCL_CORE_CHECK(nccl().getUniqueId(&id));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(idKey(prefix), std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  } else {
    const std::vector<uint8_t> bytes = store.get(idKey(prefix));
    TORCH_INTERNAL_ASSERT(
        bytes.size() == sizeof(id), "malformed NCCL unique id in the store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  return id;
}

void leaveRendezvous(c10d::Store& store, const std::string& prefix, int size) {
  try {
    store.deleteKey(idKey(prefix));
    store.deleteKey(decisionKey(prefix));
    for (int r = 0; r < size; ++r) {
      store.deleteKey(saidKey(prefix, r));
    }
  } catch (const std::exception& e) {
    LOG(INFO) << "[nccl_core] could not delete the keys of " << prefix << ": "
              << e.what();
  }
}

} // namespace nccl_core

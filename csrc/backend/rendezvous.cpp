#include "backend/rendezvous.h"

#include <cstring>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {
std::string arrivedKey(const std::string& prefix, int rank) {
  return c10::str(prefix, "/arrived/", rank);
}

std::string idKey(const std::string& prefix) {
  return prefix + "/unique_id";
}
} // namespace

ncclUniqueId rendezvous(
    c10d::Store& store,
    const std::string& prefix,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& label) {
  ncclUniqueId id;
  if (rank == 0) { // published before rank 0 counts as arrived
    NCCL_CORE_CHECK(nccl().getUniqueId(&id));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(idKey(prefix), std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  }
  store.set(arrivedKey(prefix, rank), std::vector<uint8_t>{1});
  std::vector<std::string> everyone;
  for (int r = 0; r < size; ++r) {
    everyone.push_back(arrivedKey(prefix, r));
  }
  try {
    store.wait(everyone, timeout);
  } catch (const c10::DistStoreError& e) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({everyone[r]})) {
        missing.push_back(r);
      }
    }
    C10_THROW_ERROR(
        DistBackendError,
        c10::str(
            "nccl_core: rank(s) ",
            c10::Join(", ", missing),
            " of ",
            label,
            " did not come to the initialization of its NCCL communicator "
            "within the group's timeout (",
            timeout.count(),
            " ms); rank ",
            rank,
            " waited for them (",
            e.what(),
            ")"));
  }
  if (rank != 0) {
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
    for (int r = 0; r < size; ++r) {
      store.deleteKey(arrivedKey(prefix, r));
    }
  } catch (const std::exception& e) {
    LOG(INFO) << "[nccl_core] could not delete the keys of " << prefix << ": "
              << e.what();
  }
}

} // namespace nccl_core

#include "nccl/window_pointers.h"

#include <c10/util/Exception.h>

#include "nccl/api.h"
#include "nccl/communicator.h"
#include "nccl/errors.h"
#include "nccl/version.h"

namespace nccl_core {

namespace {

[[noreturn]] void refuseOldRuntime(const char* what) {
  const NcclVersion& v = runtimeVersion();
  NCCL_CORE_CHECK_SUPPORTED(
      false,
      what,
      "needs NCCL >= 2.29 at run time (this process has ",
      v.major,
      ".",
      v.minor,
      ".",
      v.patch,
      "), or NCCL 2.28 with this extension built against NCCL 2.28's "
      "headers (it was built against ",
      NCCL_MAJOR,
      ".",
      NCCL_MINOR,
      ")");
}

// The window's communicator, held across a query of the window: RuntimeError
// once the window is closed or its communicator gone (which closes the window
// too, a moment later).
std::shared_ptr<Communicator> ownerOf(const Window& window, const char* op) {
  std::shared_ptr<Communicator> comm = window.communicator();
  window.get();
  NCCL_CORE_CHECK_STATE(
      comm != nullptr, op, "the window's communicator is gone");
  return comm;
}

// ValueError naming `op` unless `offset` lies in world rank `rank`'s part of
// `window` (or just past it).
void checkOffset(
    const Window& window,
    int rank,
    size_t offset,
    const char* op) {
  const size_t bytes = window.part(rank).bytes;
  NCCL_CORE_CHECK_ARG(
      offset <= bytes,
      op,
      "offset ",
      offset,
      " is past the end of rank ",
      rank,
      "'s part (",
      bytes,
      " bytes)");
}

// lsaPointer, on `comm`, which the caller holds; `offset` checked already.
uintptr_t lsaPointerOn(
    Communicator& comm,
    const Window& window,
    int lsaRank,
    size_t offset) {
  return window
             .lsaBases([&] {
               return lsaBases(comm, window.get(), lsaTeam(comm).size);
             })
             .at(lsaRank) +
         offset;
}

} // namespace

LsaTeam lsaTeam(Communicator& comm) {
  return detail::queryLsaTeam(comm.get());
}

std::optional<int> lsaRankOf(Communicator& comm, int peer) {
  const LsaTeam team = lsaTeam(comm);
  const int distance = peer - comm.rank();
  if (team.stride == 0 || distance % team.stride != 0) {
    return std::nullopt;
  }
  const int lsaRank = team.rank + distance / team.stride;
  if (lsaRank < 0 || lsaRank >= team.size) {
    return std::nullopt;
  }
  return lsaRank;
}

uintptr_t lsaPointer(const Window& window, int lsaRank, size_t offset) {
  const std::shared_ptr<Communicator> comm = ownerOf(window, "lsa_pointer");
  const LsaTeam team = lsaTeam(*comm);
  NCCL_CORE_CHECK_ARG(
      lsaRank >= 0 && lsaRank < team.size,
      "lsa_pointer",
      "lsa_rank ",
      lsaRank,
      " is out of range; expected 0 <= lsa_rank < ",
      team.size,
      " (the LSA team size)");
  // The world rank of LSA rank `lsaRank`, whose part `offset` is in.
  checkOffset(
      window,
      comm->rank() + (lsaRank - team.rank) * team.stride,
      offset,
      "lsa_pointer");
  return lsaPointerOn(*comm, window, lsaRank, offset);
}

bool windowAddressesReadable(const NcclApi& api) {
  return api.getLsaDevicePointer != nullptr ||
         detail::canReadLsaBasesOnDevice();
}

bool everyPeerLoadStore(Communicator& comm) {
  if (!windowAddressesReadable(comm.api())) {
    return false;
  }
  const Communicator::Use use = comm.use(); // NCCL reads the communicator
  return lsaTeam(comm).size == comm.size();
}

std::vector<uintptr_t>
lsaBases(Communicator& comm, ncclWindow_t window, int lsaSize) {
  if (const auto query = comm.api().getLsaDevicePointer) {
    std::vector<uintptr_t> bases(lsaSize);
    for (int r = 0; r < lsaSize; ++r) {
      void* ptr = nullptr;
      NCCL_CORE_CHECK(comm.api(), query(window, 0, r, &ptr));
      bases[r] = reinterpret_cast<uintptr_t>(ptr);
    }
    return bases;
  }
  if (!detail::canReadLsaBasesOnDevice()) {
    refuseOldRuntime("reading window addresses");
  }
  return detail::readLsaBases(window, lsaSize, comm.device());
}

std::optional<uintptr_t>
peerPointer(const Window& window, int peer, size_t offset) {
  const std::shared_ptr<Communicator> comm = ownerOf(window, "peer_pointer");
  NCCL_CORE_CHECK_ARG(
      peer >= 0 && peer < comm->size(),
      "peer_pointer",
      "peer ",
      peer,
      " is out of range; expected 0 <= peer < ",
      comm->size());
  checkOffset(window, peer, offset, "peer_pointer");
  const std::optional<int> lsaRank = lsaRankOf(*comm, peer);
  if (!lsaRank) {
    return std::nullopt;
  }
  return lsaPointerOn(*comm, window, *lsaRank, offset);
}

std::optional<uintptr_t> multimemPointer(const Window& window, size_t offset) {
  const std::shared_ptr<Communicator> comm =
      ownerOf(window, "multimem_pointer");
  // A multicast store reaches every LSA team member's part at `offset`.
  const LsaTeam team = lsaTeam(*comm);
  for (int lsaRank = 0; lsaRank < team.size; ++lsaRank) {
    checkOffset(
        window,
        comm->rank() + (lsaRank - team.rank) * team.stride,
        offset,
        "multimem_pointer");
  }
  const auto query = comm->api().getLsaMultimemDevicePointer;
  if (!query) {
    refuseOldRuntime("multimem_pointer");
  }
  void* ptr = nullptr;
  NCCL_CORE_CHECK(comm->api(), query(window.get(), offset, &ptr));
  if (ptr == nullptr) {
    return std::nullopt;
  }
  return reinterpret_cast<uintptr_t>(ptr);
}

} // namespace nccl_core

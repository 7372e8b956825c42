// Device addresses of a window's memory: this rank's view of each peer's part
// (LSA: load/store accessible, over NVLink or PCIe P2P). NCCL >= 2.29 answers
// on the host; on NCCL 2.28 a one-thread kernel reads them through the device
// API, which needs this extension to be built against 2.28's headers (the
// device-side window layout is private to each release).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "nccl/communicator.h"

namespace nccl_core {

// The load/store accessible team: ranks that map each other's windows.
struct LsaTeam {
  int size;
  int rank;
  int stride; // world-rank distance between consecutive LSA ranks
};

LsaTeam lsaTeam(Communicator& comm);

// The LSA rank of world rank `peer`, if it is in this rank's LSA team.
std::optional<int> lsaRankOf(Communicator& comm, int peer);

// The window address queries (lsaPointer, peerPointer, multimemPointer) run on
// the window's own communicator and raise RuntimeError once the window is
// closed or that communicator gone.

// Address of LSA rank `lsaRank`'s part of `window`, `offset` bytes in.
uintptr_t lsaPointer(const Window& window, int lsaRank, size_t offset);

// Whether this build can read window addresses on the loaded NCCL (>= 2.29's
// host API, or 2.28's device API in a build against 2.28's headers).
bool windowAddressesReadable(const NcclApi& api);

// Whether every rank of `comm` maps the others' windows (one LSA team) and
// this build can read their addresses: what the backend's engines that write
// or read peers' memory need.
bool everyPeerLoadStore(Communicator& comm);

// Base address of every LSA rank's part of `window`, as mapped on this rank.
std::vector<uintptr_t>
lsaBases(Communicator& comm, ncclWindow_t window, int lsaSize);

// Address of world rank `peer`'s part; nullopt when it is not LSA-reachable.
std::optional<uintptr_t>
peerPointer(const Window& window, int peer, size_t offset);

// Multicast address over the LSA team; nullopt without multimem support.
std::optional<uintptr_t> multimemPointer(const Window& window, size_t offset);

namespace detail {
// Implemented in window_pointers_device.cu.
LsaTeam queryLsaTeam(ncclComm_t comm);
// Whether readLsaBases works here: a build against the runtime's 2.28 headers.
bool canReadLsaBasesOnDevice();
// Whether every rank of `comm` maps the others' windows (one LSA team) and
// this build can read their addresses: what the backend's engines that write
// or read peers' memory need.
bool everyPeerLoadStore(Communicator& comm);

// Base address of every LSA rank's part of `window`, read on the device;
// needs canReadLsaBasesOnDevice().
std::vector<uintptr_t>
readLsaBases(ncclWindow_t window, int lsaSize, int device);
} // namespace detail

} // namespace nccl_core

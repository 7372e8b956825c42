// Where every rank's part of a window lies in its memory, known to every rank
// before NCCL registers the window. NCCL maps each rank's whole allocation for
// its load/store peers and addresses a peer's part at *this* rank's offset in
// its own allocation (dev_runtime.cc, 2.28 to 2.30: a window's bigOffset is
// the mapping's plus the local memOffset); before 2.30.7 it also maps a
// peer's allocation with this rank's allocation size. Parts that break either
// rule would let a put (NCCL's, or the copy engine's through NCCL's mapping)
// land outside its target's window, so every rank's part is exchanged first
// and such a layout is refused alike on every rank, before NCCL is asked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nccl_core {

class Communicator;

struct WindowPart {
  uint64_t allocationBytes = 0; // the cuMem allocation holding it
  uint64_t offset = 0;          // where it starts in that allocation
  uint64_t bytes = 0;           // its size
  int64_t flags = 0;            // ncclCommWindowRegister's
  // The rank refused its own registration (its error says why).
  bool refused = false;
};

// Every rank's part of one window, by rank.
using WindowLayout = std::vector<WindowPart>;

// Collective over `comm`: every rank's part, by rank (an all-gather on a
// stream of its own, waited for on the host).
WindowLayout exchangeLayout(Communicator& comm, const WindowPart& mine);

// Why NCCL cannot serve `layout` as one window, naming the first rank whose
// part differs from rank 0's; nullopt where it can. `ownSizes`: the runtime
// maps each rank's allocation with its own size (Feature::WindowSizesPerRank).
std::optional<std::string>
layoutConflict(const WindowLayout& layout, bool ownSizes);

} // namespace nccl_core

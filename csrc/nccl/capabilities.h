// What a communicator can do, as NCCL says at run time
// (ncclCommQueryProperties, NCCL >= 2.29): nccl4py's gin_type /
// railed_gin_type, and whether NCCL gave it symmetric memory (windows, device
// communicators) and its host one-sided API.
#pragma once

#include <string>

namespace nccl_core {

class Communicator;

struct CommCapabilities {
  bool deviceApi = false; // symmetric memory: windows, device communicators
  bool hostRma = false;   // ncclPutSignal / ncclSignal / ncclWaitSignal
  int ginType = 0;        // ncclGinType_t of FULL connections; 0: none
  int railedGinType = 0;  // ncclGinType_t of RAIL connections
  int lsaTeams = 1;       // load/store teams (hosts, for NCCL) among the ranks
};

// NotImplementedError naming `op` unless this extension was built against
// NCCL >= 2.29 and runs on that release (the struct differs between them).
// Fields NCCL has only from 2.29.7 on read as their defaults before.
CommCapabilities queryCapabilities(Communicator& comm, const char* op);

// Throws NotImplementedError naming `op` where the extension was built
// against another NCCL release than the one loaded.
void requireBuildRelease(const char* op);

// Whether NCCL gave `comm` symmetric memory (deviceApiSupport), which
// windows need from 2.29 on: its ranks one load/store team, or GIN reaching
// every rank. True before 2.29 (windows everywhere) and where NCCL cannot be
// asked (another release than the build's): the registration tells. Builds
// against 2.29.0-2.29.2 headers read 0 across teams even with GIN (NCCL's
// compatibility filter, devcomm_v22902.cc).
bool supportsWindows(Communicator& comm);

// Why NCCL handed back no window on `comm`: the message of the refusal.
std::string noWindowReason(Communicator& comm);

} // namespace nccl_core

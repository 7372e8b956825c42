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

// Whether NCCL registers windows on `comm`: before 2.29 everywhere; from
// 2.29 on only where it gave the communicator symmetric memory (its ranks
// one load/store team, or GIN reaching every rank). True where NCCL cannot
// be asked (another release than the build's): the registration tells.
bool supportsWindows(Communicator& comm);

// Why NCCL handed back no window on `comm`: the message of the refusal.
std::string noWindowReason(Communicator& comm);

} // namespace nccl_core

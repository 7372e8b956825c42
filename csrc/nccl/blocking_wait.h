// Waits that may block for long (a device-wide synchronize before freeing
// NCCL memory, joining a watchdog that runs a Python hook) may be entered with
// Python's GIL held. The Python bindings install a runner that releases the
// GIL around such a wait where the calling thread holds it; without one (no
// Python), the wait runs as is.
#pragma once

namespace nccl_core {

using BlockingWaitRunner = void (*)(void (*wait)(void*), void* arg);
void setBlockingWaitRunner(BlockingWaitRunner runner);

// Runs `wait(arg)` through the installed runner. Only where the caller holds
// no lock that a thread taking the GIL meanwhile could wait for.
void runBlockingWait(void (*wait)(void*), void* arg);

} // namespace nccl_core

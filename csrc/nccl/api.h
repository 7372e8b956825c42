// The one table of NCCL entry points the package calls, and the one place
// where entry points of newer releases are looked up. The extension links only
// symbols NCCL 2.28 exports (tests/cpu/test_linked_symbols.py), so one build
// loads on every NCCL >= 2.28; newer host functions come from dlsym and are
// null where the runtime lacks them. Each communicator calls the table it was
// made with (Communicator::Settings), so a test hands its communicators a
// scripted one (torch_nccl_core._testing) and their and the watchdog's logic
// runs in CI, which has no GPU; nothing is swapped for the whole process.
// Modelled on torchcomms' NcclApi, injected per communicator.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <optional>

namespace nccl_core {

// ncclWaitSignalDesc_t of NCCL >= 2.29: {opCnt, peer, sigIdx, ctx}.
struct NcclWaitSignalDesc {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
};

// ncclCommMemStat_t and NCCL_SUSPEND_MEM of NCCL >= 2.29.7.
enum NcclMemStat : int {
  kMemStatSuspendable = 0, // ncclStatGpuMemSuspend: bytes suspend releases
  kMemStatSuspended = 1,   // ncclStatGpuMemSuspended: 1 while suspended
  kMemStatPersistent = 2,  // ncclStatGpuMemPersist: bytes suspend keeps
  kMemStatTotal = 3,       // ncclStatGpuMemTotal
};
constexpr int kSuspendMemory = 0x01;

// Where a range of device memory lies in its cuMem allocation.
struct WindowPlace {
  size_t allocationBytes;
  size_t offset;
};

struct NcclApi {
  // NCCL 2.28: linked.
  decltype(&ncclGetVersion) getVersion;
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclGetErrorString) getErrorString;
  decltype(&ncclGetLastError) getLastError;
  decltype(&ncclCommInitRankConfig) commInitRankConfig;
  decltype(&ncclCommSplit) commSplit;
  decltype(&ncclCommShrink) commShrink;
  decltype(&ncclCommUserRank) commUserRank;
  decltype(&ncclCommCount) commCount;
  decltype(&ncclCommGetAsyncError) commGetAsyncError;
  decltype(&ncclCommAbort) commAbort;
  decltype(&ncclCommFinalize) commFinalize;
  decltype(&ncclCommRegister) commRegister;
  decltype(&ncclCommDeregister) commDeregister;
  decltype(&ncclCommWindowRegister) commWindowRegister;
  decltype(&ncclCommWindowDeregister) commWindowDeregister;
  decltype(&ncclRedOpCreatePreMulSum) redOpCreatePreMulSum;
  decltype(&ncclRedOpDestroy) redOpDestroy;
  decltype(&ncclGroupStart) groupStart;
  decltype(&ncclGroupEnd) groupEnd;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclReduce) reduce;
  decltype(&ncclAllGather) allGather;
  decltype(&ncclReduceScatter) reduceScatter;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclMemAlloc) memAlloc;
  decltype(&ncclMemFree) memFree;
  // The device API's structures are nvcc-only (nccl_device.h): opaque here.
  ncclResult_t (
      *devCommCreate)(ncclComm_t, const void* requirements, void* devComm);
  ncclResult_t (*devCommDestroy)(ncclComm_t, const void* devComm);

  // NCCL >= 2.28.7: looked up at run time, null where the runtime lacks it.
  ncclResult_t (*commRevoke)(ncclComm_t, int);

  // NCCL >= 2.29: looked up at run time, null where the runtime lacks them.
  ncclResult_t (*putSignal)(
      const void*,
      size_t,
      ncclDataType_t,
      int,
      ncclWindow_t,
      size_t,
      int,
      int,
      unsigned int,
      ncclComm_t,
      cudaStream_t);
  ncclResult_t (*signal)(int, int, int, unsigned int, ncclComm_t, cudaStream_t);
  ncclResult_t (
      *waitSignal)(int, NcclWaitSignalDesc*, ncclComm_t, cudaStream_t);
  ncclResult_t (*getLsaDevicePointer)(ncclWindow_t, size_t, int, void**);
  ncclResult_t (*getLsaMultimemDevicePointer)(ncclWindow_t, size_t, void**);
  // Its ncclCommProperties_t exists only in NCCL >= 2.29's headers.
  ncclResult_t (*commQueryProperties)(ncclComm_t, void*);
  ncclResult_t (*commGetUniqueId)(ncclComm_t, ncclUniqueId*);
  ncclResult_t (*commGrow)(
      ncclComm_t,
      int,
      const ncclUniqueId*,
      int,
      ncclComm_t*,
      ncclConfig_t*);

  // NCCL >= 2.29.7: looked up at run time, null where the runtime lacks them.
  // The statistic is an ncclCommMemStat_t (NcclMemStat).
  ncclResult_t (*commSuspend)(ncclComm_t, int);
  ncclResult_t (*commResume)(ncclComm_t);
  ncclResult_t (*commMemStats)(ncclComm_t, int, uint64_t*);

  // The CUDA runtime calls of the communicator layer and the watchdog (the
  // ops' own CUDA work goes through torch).
  decltype(&cudaGetDevice) getDevice;
  decltype(&cudaSetDevice) setDevice;
  decltype(&cudaThreadExchangeStreamCaptureMode) exchangeStreamCaptureMode;
  // Where ncclCommWindowRegister would map [ptr, ptr + bytes): the one
  // shareable cuMem allocation holding it, at an offset
  // NCCL_WIN_REQUIRED_ALIGNMENT divides (the CUDA driver's answer, as NCCL
  // 2.28's dev_runtime.cc asks it); nullopt where NCCL could not map it.
  std::optional<WindowPlace> (*windowPlace)(const void* ptr, size_t bytes);
};

// NCCL's own entry points (the newer ones where the runtime has them): what
// communicators call unless made with another table, and what calls outside
// any communicator (memory, versions, error strings) use.
const NcclApi& realNccl();

// Sets the calling thread's CUDA device through `api`, and restores the
// previous one on every exit path (NCCL's own cudaSetDevice guard pattern).
// Never throws: failures are logged.
class DeviceGuard {
 public:
  DeviceGuard(const NcclApi& api, int device);
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();

 private:
  const NcclApi& api_;
  const int device_;
  int previous_ = -1;
};

} // namespace nccl_core

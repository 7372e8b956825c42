#include "nccl/api.h"

#include <c10/cuda/CUDAException.h>
#include <cuda.h>
#include <dlfcn.h>

// Declared by nccl_device.h, which only nvcc compiles; same symbols, with
// the structures opaque.
extern "C" {
ncclResult_t
ncclDevCommCreate(ncclComm_t comm, const void* requirements, void* devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);
}

namespace nccl_core {

namespace {

// The CUDA driver's cuMem queries, looked up through the runtime (the
// extension does not link libcuda).
struct CuMemQueries {
  decltype(&cuMemGetAddressRange) addressRange = nullptr;
  decltype(&cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  decltype(&cuMemRelease) release = nullptr;
};

template <typename Fn>
void driverEntry(Fn& entry, const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(
          name, &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    entry = reinterpret_cast<Fn>(fn);
  }
}

const CuMemQueries& cuMemQueries() {
  static const CuMemQueries queries = [] {
    CuMemQueries q;
    driverEntry(q.addressRange, "cuMemGetAddressRange");
    driverEntry(q.retain, "cuMemRetainAllocationHandle");
    driverEntry(q.properties, "cuMemGetAllocationPropertiesFromHandle");
    driverEntry(q.release, "cuMemRelease");
    return q;
  }();
  return queries;
}

// torch's cudaMalloc segments have no cuMem handle to retain; NCCL memory
// and torch's expandable segments do (one handle per mapped page). NCCL
// shares the handle with its peers as a file descriptor, or a fabric handle
// across an NVLink domain: the allocation must have asked for one.
std::optional<WindowPlace> windowPlace(const void* ptr, size_t bytes) {
  const CuMemQueries& cu = cuMemQueries();
  if (!cu.addressRange || !cu.retain || !cu.properties || !cu.release) {
    return std::nullopt;
  }
  const auto address = reinterpret_cast<CUdeviceptr>(ptr);
  CUdeviceptr base = 0;
  size_t size = 0;
  if (cu.addressRange(&base, &size, address) != CUDA_SUCCESS ||
      (address - base) % NCCL_WIN_REQUIRED_ALIGNMENT != 0 ||
      address + bytes > base + size) {
    return std::nullopt;
  }
  CUmemGenericAllocationHandle handle;
  if (cu.retain(&handle, reinterpret_cast<void*>(base)) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  CUmemAllocationProp prop{};
  const bool shareable =
      cu.properties(&prop, handle) == CUDA_SUCCESS &&
      (prop.requestedHandleTypes & (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                    CU_MEM_HANDLE_TYPE_FABRIC)) != 0;
  cu.release(handle);
  if (!shareable) {
    return std::nullopt;
  }
  return WindowPlace{size, static_cast<size_t>(address - base)};
}

template <typename Fn>
void lookUp(Fn& entry, const char* name) {
  entry = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

NcclApi makeRealApi() {
  NcclApi api{};
  api.getVersion = &ncclGetVersion;
  api.getUniqueId = &ncclGetUniqueId;
  api.getErrorString = &ncclGetErrorString;
  api.getLastError = &ncclGetLastError;
  api.commInitRankConfig = &ncclCommInitRankConfig;
  api.commSplit = &ncclCommSplit;
  api.commShrink = &ncclCommShrink;
  api.commUserRank = &ncclCommUserRank;
  api.commCount = &ncclCommCount;
  api.commGetAsyncError = &ncclCommGetAsyncError;
  api.commAbort = &ncclCommAbort;
  api.commFinalize = &ncclCommFinalize;
  api.commRegister = &ncclCommRegister;
  api.commDeregister = &ncclCommDeregister;
  api.commWindowRegister = &ncclCommWindowRegister;
  api.commWindowDeregister = &ncclCommWindowDeregister;
  api.redOpCreatePreMulSum = &ncclRedOpCreatePreMulSum;
  api.redOpDestroy = &ncclRedOpDestroy;
  api.groupStart = &ncclGroupStart;
  api.groupEnd = &ncclGroupEnd;
  api.allReduce = &ncclAllReduce;
  api.broadcast = &ncclBroadcast;
  api.reduce = &ncclReduce;
  api.allGather = &ncclAllGather;
  api.reduceScatter = &ncclReduceScatter;
  api.send = &ncclSend;
  api.recv = &ncclRecv;
  api.memAlloc = &ncclMemAlloc;
  api.memFree = &ncclMemFree;
  api.devCommCreate = &ncclDevCommCreate;
  api.devCommDestroy = &ncclDevCommDestroy;
  int code = 0;
  if (ncclGetVersion(&code) == ncclSuccess && code >= NCCL_VERSION(2, 28, 7)) {
    lookUp(api.commRevoke, "ncclCommRevoke");
  }
  if (code >= NCCL_VERSION(2, 29, 0)) {
    lookUp(api.putSignal, "ncclPutSignal");
    lookUp(api.signal, "ncclSignal");
    lookUp(api.waitSignal, "ncclWaitSignal");
    lookUp(api.getLsaDevicePointer, "ncclGetLsaDevicePointer");
    lookUp(api.getLsaMultimemDevicePointer, "ncclGetLsaMultimemDevicePointer");
    lookUp(api.commQueryProperties, "ncclCommQueryProperties");
    lookUp(api.commGetUniqueId, "ncclCommGetUniqueId");
    lookUp(api.commGrow, "ncclCommGrow");
  }
  if (code >= NCCL_VERSION(2, 29, 7)) {
    lookUp(api.commSuspend, "ncclCommSuspend");
    lookUp(api.commResume, "ncclCommResume");
    lookUp(api.commMemStats, "ncclCommMemStats");
  }
  api.getDevice = &cudaGetDevice;
  api.setDevice = &cudaSetDevice;
  api.exchangeStreamCaptureMode = &cudaThreadExchangeStreamCaptureMode;
  api.windowPlace = &windowPlace;
  return api;
}

} // namespace

const NcclApi& realNccl() {
  static const NcclApi api = makeRealApi();
  return api;
}

DeviceGuard::DeviceGuard(const NcclApi& api, int device)
    : api_(api), device_(device) {
  // Warned, not thrown: teardown paths use the guard too, and a call made
  // on the wrong device reports its own error.
  C10_CUDA_CHECK_WARN(api_.getDevice(&previous_));
  if (previous_ != device_) {
    C10_CUDA_CHECK_WARN(api_.setDevice(device_));
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != device_) {
    C10_CUDA_CHECK_WARN(api_.setDevice(previous_));
  }
}

} // namespace nccl_core

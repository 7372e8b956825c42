#include "nccl/window_layout.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <memory>
#include <thread>

#include "nccl/communicator.h"
#include "nccl/version.h"

namespace nccl_core {

namespace {

// A part as the all-gather carries it.
constexpr int kWords = 5;
using Words = std::array<int64_t, kWords>;

Words wordsOf(const WindowPart& part) {
  return {
      static_cast<int64_t>(part.allocationBytes),
      static_cast<int64_t>(part.offset),
      static_cast<int64_t>(part.bytes),
      part.flags,
      part.refused ? 1 : 0};
}

WindowPart partOf(const int64_t* words) {
  return {
      static_cast<uint64_t>(words[0]),
      static_cast<uint64_t>(words[1]),
      static_cast<uint64_t>(words[2]),
      words[3],
      words[4] != 0};
}

// Waits for the work enqueued on `stream` so far, up to the communicator's
// timeout: a rank that never joins the exchange aborts the communicator then
// (as a nonblocking NCCL call that never settles does), rather than holding
// this thread on the device for ever. An abort from another thread ends the
// exchange's kernel, and so the wait.
void awaitExchange(Communicator& comm, const c10::cuda::CUDAStream& stream) {
  cudaEvent_t event = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> owned(
      event, &cudaEventDestroy);
  C10_CUDA_CHECK(cudaEventRecord(event, stream.stream()));
  const auto done = [event] {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaErrorNotReady) {
      (void)cudaGetLastError(); // no error: the exchange is under way
      return false;
    }
    C10_CUDA_CHECK(state);
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + comm.timeout();
  while (!done() && !comm.isAborted()) {
    if (std::chrono::steady_clock::now() > deadline) {
      comm.abort();
      C10_THROW_ERROR(
          DistBackendError,
          c10::str(
              "nccl_core register_window: the ranks' exchange of their parts "
              "of the window on ",
              comm.label(),
              " did not complete within ",
              comm.timeout().count(),
              " ms (a rank did not register the window); the communicator "
              "was aborted"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

} // namespace

WindowLayout exchangeLayout(Communicator& comm, const WindowPart& mine) {
  const auto device = static_cast<c10::DeviceIndex>(comm.device());
  const c10::cuda::CUDAGuard guard(device);
  // A stream of its own: the exchange waits for none of the caller's work.
  const c10::cuda::CUDAStream stream =
      c10::cuda::getStreamFromPool(false, device);
  const c10::cuda::CUDAStreamGuard onStream(stream);
  const auto onDevice =
      at::TensorOptions().dtype(at::kLong).device(at::kCUDA, device);
  Words words = wordsOf(mine);
  const at::Tensor sent =
      at::from_blob(words.data(), {kWords}, at::kLong).to(onDevice);
  const at::Tensor gathered = at::empty({comm.size(), kWords}, onDevice);
  {
    // Collective: an abort revokes the communicator under it.
    const Communicator::HostCall call(comm);
    comm.check(
        comm.api().allGather(
            sent.data_ptr(),
            gathered.data_ptr(),
            kWords,
            ncclInt64,
            call.handle(),
            stream.stream()),
        "ncclAllGather");
  }
  awaitExchange(comm, stream);
  comm.get(); // aborted meanwhile: the exchange may not have run
  const at::Tensor host = gathered.cpu();
  WindowLayout layout;
  for (int rank = 0; rank < comm.size(); ++rank) {
    layout.push_back(partOf(host[rank].data_ptr<int64_t>()));
  }
  return layout;
}

std::optional<std::string>
layoutConflict(const WindowLayout& layout, bool ownSizes) {
  for (size_t rank = 0; rank < layout.size(); ++rank) {
    if (layout[rank].refused) {
      return c10::str(
          "rank ",
          rank,
          " refused its part of the window (its error says why); no rank "
          "registered it");
    }
  }
  const WindowPart& first = layout.front();
  for (size_t rank = 1; rank < layout.size(); ++rank) {
    const WindowPart& part = layout[rank];
    if (part.flags != first.flags) {
      return c10::str(
          "rank ",
          rank,
          " asked for window flags ",
          part.flags,
          " and rank 0 for ",
          first.flags,
          "; every rank must register the window with the same flags");
    }
    if (part.offset != first.offset) {
      return c10::str(
          "rank ",
          rank,
          "'s part starts ",
          part.offset,
          " bytes into its NCCL allocation and rank 0's ",
          first.offset,
          " bytes in: NCCL addresses every peer's part at this rank's own "
          "offset, so puts would land outside their target's part. Register "
          "memory at the same offset of its allocation on every rank, e.g. a "
          "torch_nccl_core.empty(..., window=True) tensor of its own");
    }
    if (!ownSizes && part.allocationBytes != first.allocationBytes) {
      return c10::str(
          "rank ",
          rank,
          "'s part lies in an NCCL allocation of ",
          part.allocationBytes,
          " bytes and rank 0's in one of ",
          first.allocationBytes,
          ": NCCL ",
          versionText(runtimeVersion().code),
          " maps every peer's allocation with this rank's size (NCCL >= "
          "2.30.7 maps each rank's own). Allocate the same size on every rank");
    }
  }
  return std::nullopt;
}

} // namespace nccl_core

#include "backend/engines/load_store_all_reduce.h"

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "nccl/one_sided.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

using Layout = AllReduceLayout;

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

constexpr size_t KiB = 1024;
constexpr size_t MiB = KiB * KiB;

// The crossovers measured at each group size, eagerly and under capture:
// bf16 all-reduces of 8 B to 8 MiB, each kernel forced and NCCL, each in its
// own processes (benchmarks.decode on 2 and 4 x H200, NVLink;
// docs/performance.md, "Tensor-parallel decode"). At 2 ranks both kernels
// move the same bytes over the link and one-shot meets once less: it wins at
// every size. At 4, two-shot's 2/4 of the traffic wins from 512 KiB
// (captured) or 1 MiB (eager). Both beat NCCL up to 8 MiB, the staging's
// size. Other group sizes are unmeasured: NCCL runs them unless a kernel is
// asked for.
struct Measured {
  int ranks;
  AllReduceKernelChoice eager;
  AllReduceKernelChoice captured;
};
constexpr Measured kMeasured[] = {
    {2, {8 * MiB, 0}, {8 * MiB, 0}},
    {4, {512 * KiB, 8 * MiB}, {256 * KiB, 8 * MiB}},
};

} // namespace

std::optional<AllReduceKernel>
AllReduceKernelChoice::kernelFor(size_t bytes) const {
  if (bytes == 0 || bytes > maxBytes()) {
    return std::nullopt; // an empty op is NCCL's no-op
  }
  return bytes <= oneShotMax ? AllReduceKernel::OneShot
                             : AllReduceKernel::TwoShot;
}

size_t AllReduceKernelChoice::maxBytes() const {
  return std::max(oneShotMax, twoShotMax);
}

AllReduceKernelChoice
AllReduceKernelChoice::of(AllReduceKernels setting, int ranks, bool capturing) {
  constexpr size_t kAll = LoadStoreAllReduce::kMaxBytes;
  switch (setting) {
    case AllReduceKernels::Off:
      return {};
    case AllReduceKernels::OneShot:
      return {kAll, 0};
    case AllReduceKernels::TwoShot:
      return {0, kAll};
    case AllReduceKernels::Auto:
      for (const Measured& m : kMeasured) {
        if (m.ranks == ranks) {
          return capturing ? m.captured : m.eager;
        }
      }
      return {};
  }
  return {};
}

LoadStoreAllReduce::LoadStoreAllReduce(
    Communicator& comm,
    EventPool& events,
    AllReduceKernels setting)
    : comm_(comm),
      eager_(AllReduceKernelChoice::of(setting, comm.size(), false)),
      captured_(AllReduceKernelChoice::of(setting, comm.size(), true)),
      done_(events.acquire()) {
  if (comm_.size() <= Layout::kMaxRanks && everyPeerLoadStore(comm_)) {
    abortFlag_ = comm_.signals().abortFlag();
    staging_ = std::make_unique<PeerBuffer>(
        comm_,
        Layout::kDataOffset +
            std::max(eager_.maxBytes(), captured_.maxBytes()));
  }
}

bool LoadStoreAllReduce::suits(const EngineCall& call) {
  const AllReduceKernelChoice& choice = call.capturing ? captured_ : eager_;
  return staging_ && call.type == c10d::OpType::ALLREDUCE &&
         choice.kernelFor(call.output.nbytes()) &&
         loadStoreReduces(call.output.scalar_type(), call.op);
}

void LoadStoreAllReduce::enqueue(const EngineCall& call, cudaStream_t stream) {
  const at::Tensor& tensor = call.output; // reduced in place
  const int64_t count = tensor.numel();
  if (count == 0) {
    return;
  }
  const AllReduceKernel kernel =
      *(call.capturing ? captured_ : eager_).kernelFor(tensor.nbytes());
  const std::lock_guard<std::mutex> lock(enqueueMutex_);
  const PeerBuffer& buffer = *staging_;
  AllReduceArgs args{};
  args.data = tensor.data_ptr();
  for (int r = 0; r < comm_.size(); ++r) {
    args.staging[r] = r == comm_.rank()
                          ? static_cast<char*>(buffer.local())
                          : reinterpret_cast<char*>(buffer.remote(r));
  }
  args.abortFlag = abortFlag_;
  args.rank = comm_.rank();
  args.size = comm_.size();
  args.count = count;
  // The same grid and split on every rank: they depend on the count, dtype
  // and group size alone, never on this rank's alignment, which only picks
  // the kernel (blocks of every rank must cover the same elements). A
  // thread moves 16 bytes of its block's chunk at a time.
  const bool vector = reinterpret_cast<uintptr_t>(args.data) % 16 == 0;
  const int64_t pack = 16 / tensor.element_size();
  const int64_t bytesPerBlock = Layout::kThreads * 16;
  const int64_t wanted = std::clamp<int64_t>(
      ceilDiv(tensor.nbytes(), bytesPerBlock), 1, Layout::kMaxBlocks);
  args.perBlock = ceilDiv(ceilDiv(count, wanted), pack) * pack;
  args.perRank = ceilDiv(ceilDiv(args.perBlock, args.size), pack) * pack;
  const int blocks = static_cast<int>(ceilDiv(count, args.perBlock));

  const bool eager = !call.capturing;
  if (eager && stream != lastStream_) {
    // Ordered after the previous launch, whichever stream it ran on (on
    // the same stream it is already).
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, done_.get(), 0));
  }
  launchAllReduce(
      kernel, args, tensor.scalar_type(), call.op, blocks, vector, stream);
  if (eager) {
    C10_CUDA_CHECK(cudaEventRecord(done_.get(), stream));
    lastStream_ = stream;
  }
}

void LoadStoreAllReduce::drain() const noexcept {
  if (!staging_) {
    return;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (cudaEventQuery(done_.get()) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

} // namespace nccl_core

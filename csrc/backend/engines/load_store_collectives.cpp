#include "backend/engines/load_store_collectives.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_map>
#include <vector>

#include "nccl/captured_graphs.h"
#include "nccl/one_sided.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

using Layout = LoadStoreLayout;

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

constexpr size_t KiB = 1024;
constexpr size_t MiB = KiB * KiB;

// The crossovers measured at each group size, eagerly and under capture:
// bf16 ops of 8 B to 8 MiB, each kernel forced and NCCL, each in its own
// processes (benchmarks.decode on 2 and 4 x H200, NVLink;
// docs/performance.md, "Tensor-parallel decode"). All-reduce: at 2 ranks
// both kernels move the same bytes over the link and one-shot meets once
// less: it wins at every size. At 4, two-shot's 2/4 of the traffic wins from
// 512 KiB (captured) or 1 MiB (eager). All-gather and reduce-scatter: their
// kernels win at every size. Every kernel beats NCCL up to 8 MiB, the
// staging's size. Other group sizes are unmeasured: NCCL runs them unless a
// kernel is asked for.
struct Measured {
  int ranks;
  KernelChoice eager;
  KernelChoice captured;
};
constexpr Measured kMeasured[] = {
    {2, {8 * MiB, 0, 8 * MiB, 8 * MiB}, {8 * MiB, 0, 8 * MiB, 8 * MiB}},
    {4,
     {512 * KiB, 8 * MiB, 8 * MiB, 8 * MiB},
     {256 * KiB, 8 * MiB, 8 * MiB, 8 * MiB}},
};

// Groups' states, in device memory that is never freed: a graph may keep a
// state past its group, and its last release then runs on a CUDA thread,
// where no CUDA call may free it. A released state goes back to its
// device's list, so the memory held is that of the most groups alive at once.
class States {
 public:
  // A zeroed state of `device`, handed back when the last owner drops it.
  static std::shared_ptr<LoadStoreState> take(int device, cudaStream_t stream) {
    static auto* states = new States(); // outlives every owner
    LoadStoreState* state = states->pop(device);
    C10_CUDA_CHECK(cudaMemsetAsync(state, 0, sizeof(LoadStoreState), stream));
    return std::shared_ptr<LoadStoreState>(
        state, [device](LoadStoreState* s) { states->push(device, s); });
  }

 private:
  static constexpr int kPerAllocation = 64;

  LoadStoreState* pop(int device) {
    for (;;) {
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        std::vector<LoadStoreState*>& free = free_[device];
        if (!free.empty()) {
          LoadStoreState* state = free.back();
          free.pop_back();
          return state;
        }
      }
      // Outside the lock: push() runs on CUDA's thread, which an allocation
      // may wait for.
      void* block = nullptr;
      C10_CUDA_CHECK(
          cudaMalloc(&block, kPerAllocation * sizeof(LoadStoreState)));
      const std::lock_guard<std::mutex> lock(mutex_);
      for (int i = 0; i < kPerAllocation; ++i) {
        free_[device].push_back(static_cast<LoadStoreState*>(block) + i);
      }
    }
  }
  void push(int device, LoadStoreState* state) {
    const std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(state);
  }

  std::mutex mutex_;
  std::unordered_map<int, std::vector<LoadStoreState*>> free_;
};

// Polls `query` (a CUDA stream's or event's) until it is no longer
// cudaErrorNotReady or `deadline` passed; its last answer.
template <typename Query>
cudaError_t
pollUntil(const Query& query, std::chrono::steady_clock::time_point deadline) {
  cudaError_t result = query();
  while (result == cudaErrorNotReady &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    result = query();
  }
  return result;
}

} // namespace

std::optional<LoadStoreKernel>
KernelChoice::kernelFor(c10d::OpType type, size_t bytes) const {
  if (bytes == 0) {
    return std::nullopt; // an empty op is NCCL's no-op
  }
  switch (type) {
    case c10d::OpType::ALLREDUCE:
      if (bytes <= oneShotMax) {
        return LoadStoreKernel::OneShot;
      }
      if (bytes <= twoShotMax) {
        return LoadStoreKernel::TwoShot;
      }
      return std::nullopt;
    case c10d::OpType::_ALLGATHER_BASE:
      if (bytes <= allGatherMax) {
        return LoadStoreKernel::AllGather;
      }
      return std::nullopt;
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      if (bytes <= reduceScatterMax) {
        return LoadStoreKernel::ReduceScatter;
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

size_t KernelChoice::maxBytes() const {
  return std::max({oneShotMax, twoShotMax, allGatherMax, reduceScatterMax});
}

KernelChoice KernelChoice::measured(int ranks, bool capturing) {
  for (const Measured& m : kMeasured) {
    if (m.ranks == ranks) {
      return capturing ? m.captured : m.eager;
    }
  }
  return {};
}

KernelChoice
KernelChoice::of(const NcclCoreOptions& options, int ranks, bool capturing) {
  constexpr size_t kAll = LoadStoreCollectives::kMaxBytes;
  KernelChoice choice = measured(ranks, capturing);
  switch (options.allReduceKernelsSetting()) {
    case AllReduceKernels::Off:
      choice.oneShotMax = choice.twoShotMax = 0;
      break;
    case AllReduceKernels::OneShot:
      choice.oneShotMax = kAll;
      break;
    case AllReduceKernels::TwoShot:
      choice.oneShotMax = 0;
      choice.twoShotMax = kAll;
      break;
    case AllReduceKernels::Auto:
      break;
  }
  if (const std::optional<bool> gatherScatter =
          options.gatherScatterKernelsSetting()) {
    choice.allGatherMax = choice.reduceScatterMax = *gatherScatter ? kAll : 0;
  }
  return choice;
}

LoadStoreCollectives::LoadStoreCollectives(
    Communicator& comm,
    EventPool& events,
    const NcclCoreOptions& options)
    : comm_(comm),
      eager_(KernelChoice::of(options, comm.size(), false)),
      captured_(KernelChoice::of(options, comm.size(), true)),
      done_(events.acquire()) {
  if (comm_.size() > Layout::kMaxRanks || !everyPeerLoadStore(comm_)) {
    return;
  }
  const c10::cuda::CUDAGuard guard(
      static_cast<c10::DeviceIndex>(comm.device()));
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_.reset(stream);
  state_ = States::take(comm_.device(), stream);
  abortFlag_ = comm_.signals().abortFlag();
  staging_ = std::make_unique<PeerBuffer>(
      comm_,
      Layout::kDataOffset + std::max(eager_.maxBytes(), captured_.maxBytes()));
  try {
    connectNccl();
  } catch (...) {
    comm_.abort(); // before the staging, which the peers map, is freed
    throw;
  }
}

LoadStoreCollectives::~LoadStoreCollectives() {
  if (state_ && cudaEventQuery(done_.get()) == cudaErrorNotReady) {
    // An eager launch the abort's drain did not see end may still run: it
    // must find this group's state closed, never another group's, so the
    // state is never handed back (a few hundred bytes, on this fault only).
    new std::shared_ptr<LoadStoreState>(state_);
  }
}

void LoadStoreCollectives::StreamDestroyer::operator()(
    cudaStream_t stream) const noexcept {
  C10_CUDA_CHECK_WARN(cudaStreamDestroy(stream));
}

void LoadStoreCollectives::connectNccl() {
  // NCCL connects the ranks at the first collective of each algorithm, on
  // the calling thread, with every peer (NCCL_RUNTIME_CONNECT). The kernels
  // take the group's small all-reduces, so that would be some later op,
  // perhaps once a peer has gone, whose host call would then block on it:
  // an all-reduce of the smallest size and one of the largest the kernels
  // take connect now, as the built-in's first ops would. Ordinary memory:
  // on the staging's window NCCL would run its symmetric kernels instead.
  const at::Tensor scratch = at::empty(
      {static_cast<int64_t>(staging_->size() - Layout::kDataOffset)},
      at::TensorOptions().dtype(at::kByte).device(at::kCUDA, comm_.device()));
  for (const int64_t bytes : {int64_t{1}, scratch.numel()}) {
    const Communicator::Use use(comm_);
    comm_.check(
        comm_.api().allReduce(
            scratch.data_ptr(),
            scratch.data_ptr(),
            bytes,
            ncclUint8,
            ncclSum,
            use.handle(),
            stream_.get()),
        "ncclAllReduce");
  }
  // Bounded, as the communicator's initialization is: a peer gone now
  // would hold these all-reduces for ever.
  const cudaError_t done = pollUntil(
      [this] { return cudaStreamQuery(stream_.get()); },
      std::chrono::steady_clock::now() + comm_.timeout());
  TORCH_CHECK_WITH(
      DistBackendError,
      done != cudaErrorNotReady,
      "the all-reduces that connect NCCL's ranks did not end within the "
      "timeout (",
      comm_.timeout().count(),
      " ms): a peer did not take part");
  C10_CUDA_CHECK(done);
}

bool LoadStoreCollectives::suits(const EngineCall& call) {
  if (!staging_) {
    return false;
  }
  const KernelChoice& choice = call.capturing ? captured_ : eager_;
  const size_t bytes = std::max(call.output.nbytes(), call.input.nbytes());
  const std::optional<LoadStoreKernel> kernel =
      choice.kernelFor(call.type, bytes);
  if (!kernel) {
    return false;
  }
  // An all-gather moves bytes; the others reduce.
  return *kernel == LoadStoreKernel::AllGather ||
         (call.reduction &&
          loadStoreReduces(call.output.scalar_type(), *call.reduction));
}

void LoadStoreCollectives::enqueue(
    const EngineCall& call,
    cudaStream_t stream) {
  const size_t bytes = std::max(call.output.nbytes(), call.input.nbytes());
  const LoadStoreKernel kernel =
      *(call.capturing ? captured_ : eager_).kernelFor(call.type, bytes);
  LoadStoreArgs args{};
  args.input = call.input.data_ptr();
  args.output = call.output.data_ptr();
  // Elements of the all-reduce or of each rank's part (an all-gather's in
  // bytes), and how many of them a 16-byte pack holds.
  const bool gather = kernel == LoadStoreKernel::AllGather;
  const int64_t element = gather ? 1 : call.output.element_size();
  args.count = gather ? call.input.nbytes() : call.output.numel();
  if (args.count == 0) {
    return;
  }
  const std::lock_guard<std::mutex> lock(enqueueMutex_);
  const PeerBuffer& buffer = *staging_;
  for (int r = 0; r < comm_.size(); ++r) {
    args.staging[r] = r == comm_.rank()
                          ? static_cast<char*>(buffer.local())
                          : reinterpret_cast<char*>(buffer.remote(r));
  }
  args.abortFlag = abortFlag_;
  args.state = state_.get();
  args.rank = comm_.rank();
  args.size = comm_.size();
  // The same grid and split on every rank: they depend on the count, dtype
  // and group size alone, never on this rank's alignment, which only picks
  // the kernel (blocks of every rank must cover the same elements). A
  // thread moves 16 bytes of its block's chunk at a time; parts of a
  // multiple of that keep every rank's part aligned.
  const int64_t pack = 16 / element;
  const bool parted = kernel == LoadStoreKernel::AllGather ||
                      kernel == LoadStoreKernel::ReduceScatter;
  const bool vector = reinterpret_cast<uintptr_t>(args.input) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(args.output) % 16 == 0 &&
                      (!parted || args.count % pack == 0);
  const int64_t bytesPerBlock = Layout::kThreads * 16;
  const int64_t wanted = std::clamp<int64_t>(
      ceilDiv(static_cast<int64_t>(bytes), bytesPerBlock),
      1,
      Layout::kMaxBlocks);
  args.perBlock = ceilDiv(ceilDiv(args.count, wanted), pack) * pack;
  args.perRank = ceilDiv(ceilDiv(args.perBlock, args.size), pack) * pack;
  const int blocks = static_cast<int>(ceilDiv(args.count, args.perBlock));

  const bool eager = !call.capturing;
  if (!eager) {
    // The graph may outlive the group: it keeps the state closed then.
    if (const auto capture = activeCapture(stream);
        capture && capture->id != lastCapture_) {
      keepUntilDestroyed(capture->graph, state_);
      lastCapture_ = capture->id;
    }
  }
  if (eager && stream != lastStream_) {
    // Ordered after the previous launch, whichever stream it ran on (on
    // the same stream it is already).
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, done_.get(), 0));
  }
  launchLoadStore(
      kernel,
      args,
      call.output.scalar_type(),
      call.reduction.value_or(c10d::ReduceOp::SUM),
      blocks,
      vector,
      stream);
  if (eager) {
    C10_CUDA_CHECK(cudaEventRecord(done_.get(), stream));
    lastStream_ = stream;
  }
}

void LoadStoreCollectives::drain() const noexcept {
  if (!staging_) {
    return;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(1);
  {
    // May run beside another thread's capture, which it must not break.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    C10_CUDA_CHECK_WARN(cudaThreadExchangeStreamCaptureMode(&mode));
    const c10::cuda::CUDAGuard guard(
        static_cast<c10::DeviceIndex>(comm_.device()));
    C10_CUDA_CHECK_WARN(cudaMemsetAsync(
        &state_->closed, 0xff, sizeof(state_->closed), stream_.get()));
    pollUntil([this] { return cudaStreamQuery(stream_.get()); }, deadline);
    C10_CUDA_CHECK_WARN(cudaThreadExchangeStreamCaptureMode(&mode));
  }
  pollUntil([this] { return cudaEventQuery(done_.get()); }, deadline);
}

} // namespace nccl_core

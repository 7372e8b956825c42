#include "backend/engines/copy_engine_reduce_scatter.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "nccl/one_sided.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

// Ops and dtypes whose ATen reduction gives NCCL's result (bool and float8
// excluded: NCCL reduces them as bytes or not at all).
bool reducesLikeNccl(RedOpType op, at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
      return op == RedOpType::SUM || op == RedOpType::AVG ||
             op == RedOpType::PRODUCT || op == RedOpType::MIN ||
             op == RedOpType::MAX;
    case at::kByte:
    case at::kChar:
    case at::kInt:
    case at::kLong:
      return op == RedOpType::SUM || op == RedOpType::PRODUCT ||
             op == RedOpType::MIN || op == RedOpType::MAX;
    default:
      return false;
  }
}

// `into` = `into` op `other`, or (first) `into` = `mine` op `other`.
void combine(
    at::Tensor& into,
    const at::Tensor& mine,
    const at::Tensor& other,
    RedOpType op) {
  switch (op) {
    case RedOpType::PRODUCT:
      at::mul_out(into, mine, other);
      return;
    case RedOpType::MIN:
      at::minimum_out(into, mine, other);
      return;
    case RedOpType::MAX:
      at::maximum_out(into, mine, other);
      return;
    default: // SUM, AVG
      at::add_out(into, mine, other);
  }
}

// Sender `from`'s region in rank `to`'s staging (no region for itself).
size_t regionOf(int from, int to) {
  return static_cast<size_t>(from < to ? from : from - 1);
}

} // namespace

CopyEngineReduceScatter::CopyEngineReduceScatter(
    Communicator& comm,
    EventPool& events)
    : comm_(comm), order_(events.acquire()) {}

bool CopyEngineReduceScatter::hasStaging() const {
  std::lock_guard<std::mutex> lock(stagingMutex_);
  return staging_ != nullptr;
}

bool CopyEngineReduceScatter::suits(const EngineCall& call) {
  if (call.type != c10d::OpType::_REDUCE_SCATTER_BASE || comm_.size() < 2 ||
      call.capturing || !call.reduction ||
      !reducesLikeNccl(*call.reduction, call.output.scalar_type())) {
    return false;
  }
  if (!allPeersLoadStore_) {
    allPeersLoadStore_ = everyPeerLoadStore(comm_);
  }
  return *allPeersLoadStore_;
}

const Staging& CopyEngineReduceScatter::staging(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(stagingMutex_);
    if (staging_) {
      return *staging_;
    }
  }
  // Collective, so made without the lock (drain must stay possible).
  auto made = std::make_unique<Staging>(comm_, bytes);
  std::lock_guard<std::mutex> lock(stagingMutex_);
  // Aborted meanwhile, after a drain that found no staging: nothing may
  // copy into the peers' memory now. (The abort sets its flag before it
  // drains, and a drain takes this lock.)
  comm_.get();
  staging_ = std::move(made);
  return *staging_;
}

void CopyEngineReduceScatter::drain() const noexcept {
  std::lock_guard<std::mutex> lock(stagingMutex_);
  if (staging_) {
    // With the signal waits ended the copies finish at once, unless other
    // streams hold them.
    staging_->drain(std::chrono::seconds(1));
  }
}

// What the chunks of one enqueue share.
struct CopyEngineReduceScatter::Pass {
  SignalWindow& signals; // before the staging, as both are first made
  const Staging& staging;
  const at::Tensor out; // flat
  const at::Tensor in;  // flat: every rank's part, in rank order
  const RedOpType op;
};

// Elements [first, first + n) of each rank's part, staged `slotOffset` bytes
// into the sender's region at every peer.
struct CopyEngineReduceScatter::Chunk {
  int64_t first;
  int64_t n;
  size_t slotOffset;
};

void CopyEngineReduceScatter::after(cudaStream_t waiter, cudaStream_t stream) {
  C10_CUDA_CHECK(cudaEventRecord(order_.get(), stream));
  C10_CUDA_CHECK(cudaStreamWaitEvent(waiter, order_.get(), 0));
}

void CopyEngineReduceScatter::enqueue(
    const EngineCall& call,
    cudaStream_t stream) {
  const Pass pass{
      comm_.signals(),
      staging((comm_.size() - 1) * kRegionBytes),
      call.output.view(-1),
      call.input.view(-1),
      *call.reduction};
  const Staging& staging = pass.staging;
  after(staging.copies(), stream);
  after(staging.reductions(), stream);
  const int64_t count = pass.out.numel();
  // At least two chunks, so that reducing one overlaps copying the next.
  const int64_t chunk = std::max<int64_t>(
      1,
      std::min<int64_t>(
          static_cast<int64_t>(kChunkBytes) / pass.out.element_size(),
          (count + 1) / 2));
  const c10::cuda::CUDAStreamGuard onReductions(
      at::cuda::getStreamFromExternal(
          staging.reductions(), static_cast<c10::DeviceIndex>(comm_.device())));
  for (int64_t first = 0; first < count; first += chunk) {
    const Chunk part{
        first, std::min(chunk, count - first), nextSlot_ * kChunkBytes};
    send(pass, part);
    reduce(pass, part);
    nextSlot_ = (nextSlot_ + 1) % kSlots;
  }
  // The op is done on `stream` once its inputs were read and every stream
  // that worked for it is through.
  for (cudaStream_t worker :
       {staging.copies(), staging.signals(), staging.reductions()}) {
    after(stream, worker);
  }
}

void CopyEngineReduceScatter::send(const Pass& pass, const Chunk& part) {
  const Staging& staging = pass.staging;
  const int self = comm_.rank();
  const int64_t elementSize = pass.in.element_size();
  const int64_t count = pass.out.numel();
  if (slotsInUse_ == kSlots) {
    // The slot reused now (the oldest) is free once every peer says so.
    // Waited for on the gate, so that only the copy that needs it waits.
    pass.signals.waitAllPeers(SignalChannel::StagingFreed, 1, staging.gate());
    after(staging.copies(), staging.gate());
    --slotsInUse_;
  }
  const auto* source = static_cast<const char*>(pass.in.data_ptr());
  for (int peer = 0; peer < comm_.size(); ++peer) {
    if (peer == self) {
      continue;
    }
    const uintptr_t target = staging.buffer().remote(peer) +
                             regionOf(self, peer) * kRegionBytes +
                             part.slotOffset;
    C10_CUDA_CHECK(cudaMemcpyAsync(
        reinterpret_cast<void*>(target),
        source + (peer * count + part.first) * elementSize,
        part.n * elementSize,
        cudaMemcpyDeviceToDevice,
        staging.copies()));
  }
  // Signalled from another stream: the next copy starts at once.
  after(staging.signals(), staging.copies());
  pass.signals.signalAllPeers(SignalChannel::StagingFilled, staging.signals());
  ++slotsInUse_;
}

// On the reductions stream, which the caller made the current one.
void CopyEngineReduceScatter::reduce(const Pass& pass, const Chunk& part) {
  const Staging& staging = pass.staging;
  const int self = comm_.rank();
  pass.signals.waitAllPeers(
      SignalChannel::StagingFilled, 1, staging.reductions());
  at::Tensor into = pass.out.narrow(0, part.first, part.n);
  const at::Tensor mine =
      pass.in.narrow(0, self * pass.out.numel() + part.first, part.n);
  bool firstPeer = true;
  for (int peer = 0; peer < comm_.size(); ++peer) {
    if (peer == self) {
      continue;
    }
    const at::Tensor theirs = at::from_blob(
        static_cast<char*>(staging.buffer().local()) +
            regionOf(peer, self) * kRegionBytes + part.slotOffset,
        {part.n},
        pass.out.options());
    combine(into, firstPeer ? mine : into, theirs, pass.op);
    firstPeer = false;
  }
  if (pass.op == RedOpType::AVG) {
    into.div_(comm_.size());
  }
  pass.signals.signalAllPeers(
      SignalChannel::StagingFreed, staging.reductions());
}

} // namespace nccl_core

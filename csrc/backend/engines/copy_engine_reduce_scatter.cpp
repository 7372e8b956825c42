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

// Long, but one pipeline: its steps (gate, copies, signals, reductions) share
// each chunk's slot and the four staging streams.
void CopyEngineReduceScatter::enqueue(
    const EngineCall& call,
    cudaStream_t stream) {
  const RedOpType op = *call.reduction;
  const int size = comm_.size();
  const int self = comm_.rank();
  const size_t region = kSlots * kChunkBytes; // per sender
  SignalWindow& signals = comm_.signals();
  const Staging& staging = this->staging((size - 1) * region);
  const PeerBuffer& buffer = staging.buffer();
  cudaStream_t copies = staging.copies();
  cudaStream_t gate = staging.gate();
  cudaStream_t signalling = staging.signals();
  cudaStream_t reductions = staging.reductions();
  // Sender `from`'s region in rank `to`'s staging.
  const auto regionOf = [](int from, int to) {
    return static_cast<size_t>(from < to ? from : from - 1);
  };
  // `waiter` goes on once `stream`'s work so far is done. One event serves
  // every pair: a wait takes the event as last recorded.
  const auto after = [&](cudaStream_t waiter, cudaStream_t stream) {
    C10_CUDA_CHECK(cudaEventRecord(order_.get(), stream));
    C10_CUDA_CHECK(cudaStreamWaitEvent(waiter, order_.get(), 0));
  };

  after(copies, stream);
  after(reductions, stream);
  const at::Tensor out = call.output.view(-1);
  const at::Tensor in = call.input.view(-1);
  const int64_t count = out.numel();
  const int64_t elementSize = out.element_size();
  // At least two chunks, so that reducing one overlaps copying the next.
  const int64_t chunk = std::max<int64_t>(
      1,
      std::min<int64_t>(
          static_cast<int64_t>(kChunkBytes) / elementSize, (count + 1) / 2));
  const auto* source = static_cast<const char*>(in.data_ptr());
  const at::cuda::CUDAStream reduceStream = at::cuda::getStreamFromExternal(
      reductions, static_cast<c10::DeviceIndex>(comm_.device()));
  c10::cuda::CUDAStreamGuard onReductions(reduceStream);

  for (int64_t first = 0; first < count; first += chunk) {
    const int64_t n = std::min(chunk, count - first);
    const size_t slotOffset = nextSlot_ * kChunkBytes;
    if (slotsInUse_ == kSlots) {
      // The slot reused now (the oldest) is free once every peer says so.
      // Waited for on `gate`, so that only the copy that needs it waits.
      signals.waitAllPeers(SignalChannel::StagingFreed, 1, gate);
      after(copies, gate);
      --slotsInUse_;
    }
    for (int peer = 0; peer < size; ++peer) {
      if (peer == self) {
        continue;
      }
      const uintptr_t target =
          buffer.remote(peer) + regionOf(self, peer) * region + slotOffset;
      C10_CUDA_CHECK(cudaMemcpyAsync(
          reinterpret_cast<void*>(target),
          source + (peer * count + first) * elementSize,
          n * elementSize,
          cudaMemcpyDeviceToDevice,
          copies));
    }
    // Signalled from another stream: the next copy starts at once.
    after(signalling, copies);
    signals.signalAllPeers(SignalChannel::StagingFilled, signalling);
    ++slotsInUse_;

    signals.waitAllPeers(SignalChannel::StagingFilled, 1, reductions);
    at::Tensor into = out.narrow(0, first, n);
    const at::Tensor mine = in.narrow(0, self * count + first, n);
    bool firstPeer = true;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == self) {
        continue;
      }
      const at::Tensor theirs = at::from_blob(
          static_cast<char*>(buffer.local()) + regionOf(peer, self) * region +
              slotOffset,
          {n},
          out.options());
      combine(into, firstPeer ? mine : into, theirs, op);
      firstPeer = false;
    }
    if (op == RedOpType::AVG) {
      into.div_(size);
    }
    signals.signalAllPeers(SignalChannel::StagingFreed, reductions);
    nextSlot_ = (nextSlot_ + 1) % kSlots;
  }
  // The op is done on `stream` once its inputs were read and every stream
  // that worked for it is through.
  for (cudaStream_t worker : {copies, signalling, reductions}) {
    after(stream, worker);
  }
}

} // namespace nccl_core

#include "backend/engines/one_shot_all_reduce.h"

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "backend/engines/one_shot_all_reduce_kernel.h"
#include "nccl/one_sided.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

namespace {

using Layout = OneShotLayout;

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

} // namespace

OneShotAllReduce::OneShotAllReduce(Communicator& comm, EventPool& events)
    : comm_(comm), done_(events.acquire()) {}

bool OneShotAllReduce::hasStaging() const {
  std::lock_guard<std::mutex> lock(stagingMutex_);
  return staging_ != nullptr;
}

bool OneShotAllReduce::suits(const EngineCall& call) {
  if (call.type != c10d::OpType::ALLREDUCE ||
      static_cast<size_t>(call.output.nbytes()) > kMaxBytes ||
      comm_.size() > Layout::kMaxRanks ||
      !oneShotReduces(call.output.scalar_type(), call.op) ||
      (call.capturing && !hasStaging())) {
    return false;
  }
  if (!allPeersLoadStore_) {
    allPeersLoadStore_ = everyPeerLoadStore(comm_);
  }
  return *allPeersLoadStore_;
}

const PeerBuffer& OneShotAllReduce::staging() {
  {
    std::lock_guard<std::mutex> lock(stagingMutex_);
    if (staging_) {
      return *staging_;
    }
  }
  // Collective, so made without the lock (drain must stay possible).
  const int* abortFlag = comm_.signals().abortFlag();
  auto made =
      std::make_unique<PeerBuffer>(comm_, Layout::kDataOffset + kMaxBytes);
  std::lock_guard<std::mutex> lock(stagingMutex_);
  comm_.get(); // aborted meanwhile: nothing may write to the peers now
  abortFlag_ = abortFlag;
  staging_ = std::move(made);
  return *staging_;
}

void OneShotAllReduce::enqueue(const EngineCall& call, cudaStream_t stream) {
  const at::Tensor& tensor = call.output; // reduced in place
  const int64_t count = tensor.numel();
  if (count == 0) {
    return;
  }
  const PeerBuffer& buffer = staging();
  OneShotArgs args{};
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
  // The same grid and split on every rank: they depend on the count and
  // dtype alone, never on this rank's alignment, which only picks the
  // kernel (blocks of every rank must cover the same elements).
  const bool vector = reinterpret_cast<uintptr_t>(args.data) % 16 == 0;
  const int64_t pack = 16 / tensor.element_size();
  const int64_t bytesPerBlock = Layout::kThreads * 16;
  const int64_t wanted = std::clamp<int64_t>(
      ceilDiv(tensor.nbytes(), bytesPerBlock), 1, Layout::kMaxBlocks);
  args.perBlock = ceilDiv(ceilDiv(count, wanted), pack) * pack;
  const int blocks = static_cast<int>(ceilDiv(count, args.perBlock));

  const bool eager = !call.capturing;
  if (eager && stream != lastStream_) {
    // Ordered after the previous launch, whichever stream it ran on (on
    // the same stream it is already).
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, done_.get(), 0));
  }
  launchOneShotAllReduce(
      args, tensor.scalar_type(), call.op, blocks, vector, stream);
  if (eager) {
    C10_CUDA_CHECK(cudaEventRecord(done_.get(), stream));
    lastStream_ = stream;
  }
}

void OneShotAllReduce::drain() const noexcept {
  std::lock_guard<std::mutex> lock(stagingMutex_);
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

// NcclCoreBackend's side of torch's window API (new_window, runWindowOp) and
// the TorchWindow it returns.
#include "backend/ops/windows.h"

#ifdef C10D_BACKEND_HAS_WINDOW

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include "backend/ops/arguments.h"
#include "backend/routing/tensor_registration.h"
#include "nccl/blocking_wait.h"
#include "nccl/capabilities.h"
#include "nccl/errors.h"
#include "nccl/one_sided.h"
#include "nccl/window_pointers.h"

namespace nccl_core {

c10::intrusive_ptr<c10d::Window>
NcclCoreBackend::new_window(const std::optional<at::Tensor>& tensor) {
  auto window = c10::make_intrusive<TorchWindow>(
      c10::intrusive_ptr<NcclCoreBackend>::reclaim_copy(this));
  if (tensor) {
    window->tensor_register(*tensor, /*owning=*/true);
  }
  return window;
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::runWindowOp(
    WindowOp op,
    at::Device device,
    c10::function_ref<void(cudaStream_t)> enqueue) {
  refuseInsideCoalescing(op.name);
  SyncOpDetail detail;
  detail.addPeer(op.peer);
  detail.waitsOnPeers = op.waits;
  LaunchOptions options = LaunchOptions::withPeer(op.peer);
  options.oneSided = &detail;
  return runner_.launch(
      OpCall{c10d::OpType::UNKNOWN, op.name, device, op.asyncOp, op.timeout},
      {},
      std::move(op.inputs),
      [&](const NcclTarget& to) {
        enqueue(to.stream);
        return ncclSuccess;
      },
      options);
}

namespace {

// Every rank's dtype of its registered tensor (an all-gather on the group).
std::vector<at::ScalarType> allGatherDtypes(
    NcclCoreBackend& backend,
    at::ScalarType dtype,
    c10::DeviceIndex device) {
  const auto options =
      at::TensorOptions().dtype(at::kLong).device(at::kCUDA, device);
  at::Tensor mine = at::full({1}, static_cast<int64_t>(dtype), options);
  at::Tensor all = at::empty({backend.getSize()}, options);
  backend._allgather_base(all, mine, c10d::AllgatherOptions())->wait();
  const at::Tensor host = all.cpu();
  std::vector<at::ScalarType> dtypes;
  for (int64_t rank = 0; rank < host.numel(); ++rank) {
    dtypes.push_back(
        static_cast<at::ScalarType>(host.data_ptr<int64_t>()[rank]));
  }
  return dtypes;
}

} // namespace

TorchWindow::TorchWindow(c10::intrusive_ptr<NcclCoreBackend> backend)
    : backend_(std::move(backend)) {}

void TorchWindow::tensor_register(const at::Tensor& tensor, bool owning) {
  constexpr const char* kOp = "tensor_register";
  NCCL_CORE_CHECK_STATE(
      window_ == nullptr,
      kOp,
      "the window already holds a tensor; call tensor_deregister first");
  backend_->refuseInsideCoalescing(kOp);
  // Refusals come within the registration, which every rank joins, so that
  // a rank's bad tensor (one that names no CUDA device too: the group's
  // device then) is refused on every rank alike; a process without a GPU
  // has no group to join.
  if (c10::cuda::device_count() == 0) {
    checkCuda(tensor, kOp, "tensor");
  }
  std::shared_ptr<Communicator> comm = backend_->sharedCommunicator(
      tensor.is_cuda() ? std::optional<at::Device>(tensor.device())
                       : std::nullopt);
  std::shared_ptr<nccl_core::Window> window =
      registerTensorWindow(*comm, tensor, NCCL_WIN_DEFAULT);
  NCCL_CORE_CHECK_SUPPORTED(window != nullptr, kOp, noWindowReason(*comm));
  // torch's window API counts offsets in elements of the window's dtype: a
  // put must match its target's, as torch's own NCCL window requires.
  peerDtypes_ = allGatherDtypes(
      *backend_,
      tensor.scalar_type(),
      static_cast<c10::DeviceIndex>(comm->device()));
  comm_ = std::move(comm);
  window_ = std::move(window);
  sizes_ = tensor.sizes().vec();
  dtype_ = tensor.scalar_type();
  if (owning) {
    owned_ = tensor;
  }
}

void TorchWindow::tensor_deregister() {
  constexpr const char* kOp = "tensor_deregister";
  NCCL_CORE_CHECK_STATE(
      window_ != nullptr,
      kOp,
      "the window holds no tensor; call tensor_register first");
  backend_->refuseInsideCoalescing(kOp);
  // Every rank's ops issued before, puts into this rank's memory among
  // them, finish before NCCL unmaps the window (MPI_Win_free's rule). On a
  // failed group the barrier raises; the window is released all the same.
  std::exception_ptr failure;
  try {
    auto barrier = backend_->barrier(c10d::BarrierOptions());
    // Without the GIL: an abort hook in Python may be what ends it.
    runBlockingWait(
        [](void* work) { static_cast<c10d::Work*>(work)->wait(); },
        barrier.get());
  } catch (const c10::DistBackendError&) {
    failure = std::current_exception();
  }
  window_->close();
  window_.reset();
  comm_.reset();
  owned_.reset();
  sizes_.clear();
  peerDtypes_.clear();
  if (failure) {
    std::rethrow_exception(failure);
  }
}

const nccl_core::Window& TorchWindow::registered(const char* op) const {
  NCCL_CORE_CHECK_STATE(
      window_ != nullptr,
      op,
      "the window holds no tensor; call tensor_register first (or pass a "
      "tensor to new_window)");
  window_->get(); // RuntimeError once closed (its memory freed, or its group)
  return *window_;
}

int TorchWindow::checkedPeer(int64_t peer, const char* op) const {
  registered(op);
  checkPeer(*comm_, peer, op);
  return static_cast<int>(peer);
}

c10::intrusive_ptr<c10d::Work>
TorchWindow::run(WindowOp op, c10::function_ref<void(cudaStream_t)> enqueue) {
  return backend_->runWindowOp(
      std::move(op),
      at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(comm_->device())),
      enqueue);
}

c10::intrusive_ptr<c10d::Work> TorchWindow::put(
    const at::Tensor& tensor,
    int64_t dstRank,
    int64_t targetOffsetNelems,
    bool asyncOp,
    const c10d::PutOptions& opts) {
  constexpr const char* kOp = "put";
  const int peer = checkedPeer(dstRank, kOp);
  const PutSignal put = checkedPutSignal(
      *comm_, tensor, {*window_, peer, targetOffsetNelems}, kOp);
  NCCL_CORE_CHECK_ARG(
      tensor.scalar_type() == peerDtypes_[peer],
      kOp,
      "tensor is ",
      tensor.scalar_type(),
      " but rank ",
      peer,
      "'s window holds ",
      peerDtypes_[peer],
      " (offsets count elements of the window's dtype)");
  return run(
      {kOp, put.peer, /*waits=*/false, asyncOp, opts.timeout, {tensor}},
      [&](cudaStream_t stream) { enqueuePutSignal(*comm_, put, stream); });
}

c10::intrusive_ptr<c10d::Work> TorchWindow::signal(
    int64_t peerRank,
    bool asyncOp,
    const c10d::SignalOptions& opts) {
  return signalling(peerRank, asyncOp, opts.timeout, /*waits=*/false);
}

c10::intrusive_ptr<c10d::Work> TorchWindow::wait_signal(
    int64_t peerRank,
    bool asyncOp,
    const c10d::WaitSignalOptions& opts) {
  return signalling(peerRank, asyncOp, opts.timeout, /*waits=*/true);
}

c10::intrusive_ptr<c10d::Work> TorchWindow::signalling(
    int64_t peerRank,
    bool asyncOp,
    std::chrono::milliseconds timeout,
    bool waits) {
  const char* op = waits ? "wait_signal" : "signal";
  const int peer = checkedPeer(peerRank, op);
  return run({op, peer, waits, asyncOp, timeout, {}}, [&](cudaStream_t stream) {
    if (waits) {
      enqueueWaitSignal(*comm_, {WaitSignalDesc{peer}}, stream);
    } else {
      enqueueSignal(*comm_, peer, stream);
    }
  });
}

at::Tensor TorchWindow::map_remote_tensor(int64_t rank) {
  constexpr const char* kOp = "map_remote_tensor";
  const nccl_core::Window& window = registered(kOp);
  checkRank(rank, backend_->getSize(), kOp, "rank");
  const auto peer = static_cast<int>(rank);
  Communicator& comm = *comm_;
  const at::Device device(
      at::kCUDA, static_cast<c10::DeviceIndex>(comm.device()));
  // Mapped here, though its memory may sit on a peer's GPU: the device is
  // told, not asked of CUDA (as torch's symmetric memory does).
  const auto view = [&](void* data, at::IntArrayRef sizes) {
    return at::for_blob(data, sizes)
        .options(at::TensorOptions().dtype(dtype_).device(device))
        .target_device(device)
        .make_tensor();
  };
  if (peer == comm.rank()) {
    return owned_ ? *owned_ : view(window.userPtr(), sizes_);
  }
  const std::optional<uintptr_t> address = peerPointer(window, peer, 0);
  NCCL_CORE_CHECK_SUPPORTED(
      address.has_value(),
      kOp,
      "rank ",
      peer,
      " is not load/store reachable from rank ",
      comm.rank(),
      " (get_attr says SEPARATE); reach it with put");
  // The peer's own size, which may differ from this rank's: a flat view
  // then.
  const size_t bytes = window.part(peer).bytes;
  auto* data = reinterpret_cast<void*>(*address);
  if (bytes == window.size()) {
    return view(data, sizes_);
  }
  const auto elements = static_cast<int64_t>(bytes / c10::elementSize(dtype_));
  return view(data, {elements});
}

c10d::WindowAttr TorchWindow::get_attr(int64_t peerRank) {
  constexpr const char* kOp = "get_attr";
  registered(kOp);
  checkRank(peerRank, backend_->getSize(), kOp, "rank");
  const auto peer = static_cast<int>(peerRank);
  c10d::WindowAttr attr;
  attr.access_type = lsaRankOf(*comm_, peer).has_value()
                         ? c10d::WindowAccessType::UNIFIED
                         : c10d::WindowAccessType::SEPARATE;
  return attr;
}

} // namespace nccl_core

#endif // C10D_BACKEND_HAS_WINDOW

// torch's one-sided window (c10d::Window, torch >= 2.14:
// torch.distributed._new_window) over this package's windows and one-sided
// engines (nccl/one_sided.h). Each op runs as an op of the group (numbered,
// profiled, timed by its watchdog) and returns its Work. Beyond
// torch's own NCCL window: any CUDA tensor may be put (not only one inside a
// registered window) to a peer reachable by load/store (NVLink, PCIe P2P),
// it runs on NCCL 2.28 too, and such peers report UNIFIED access and can be
// mapped.
#pragma once

#include "backend/backend.h"

#ifdef C10D_BACKEND_HAS_WINDOW

#include <torch/csrc/distributed/c10d/Window.hpp>

namespace nccl_core {

class TorchWindow final : public c10d::Window {
 public:
  explicit TorchWindow(c10::intrusive_ptr<NcclCoreBackend> backend);

  // Collective: every rank registers its tensor (NCCL memory, e.g.
  // torch_nccl_core.empty or the group's allocate_tensor) together. Sizes
  // may differ between ranks; a put must fit its target's.
  void tensor_register(const at::Tensor& tensor, bool owning) override;
  // Collective: releases the NCCL window; views from map_remote_tensor end
  // with it.
  void tensor_deregister() override;

  // Writes `tensor` into `dstRank`'s window, `targetOffsetNelems` elements
  // of `tensor`'s dtype in, then raises a signal there.
  c10::intrusive_ptr<c10d::Work>
  put(const at::Tensor& tensor,
      int64_t dstRank,
      int64_t targetOffsetNelems,
      bool asyncOp,
      const c10d::PutOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> signal(
      int64_t peerRank,
      bool asyncOp,
      const c10d::SignalOptions& opts) override;
  // Waits for (and consumes) one signal of `peerRank`: after it, what that
  // peer put before the signal is visible.
  c10::intrusive_ptr<c10d::Work> wait_signal(
      int64_t peerRank,
      bool asyncOp,
      const c10d::WaitSignalOptions& opts) override;

  // This rank's tensor, or a view of `rank`'s window memory where it is
  // load/store reachable (NotImplementedError otherwise), valid until
  // tensor_deregister.
  at::Tensor map_remote_tensor(int64_t rank) override;
  // UNIFIED for this rank and load/store peers, SEPARATE for the others.
  c10d::WindowAttr get_attr(int64_t peerRank) override;

 private:
  // The registered window; RuntimeError naming `op` without one or once it
  // was closed.
  const nccl_core::Window& registered(const char* op) const;
  // `peer` as another rank of the group, once the window holds a tensor
  // (ValueError, RuntimeError naming `op` otherwise).
  int checkedPeer(int64_t peer, const char* op) const;
  // signal (or, `waits`, wait_signal) toward `peerRank`.
  c10::intrusive_ptr<c10d::Work> signalling(
      int64_t peerRank,
      bool asyncOp,
      std::chrono::milliseconds timeout,
      bool waits);
  // Runs `op` as an op of the group (runWindowOp).
  c10::intrusive_ptr<c10d::Work>
  run(WindowOp op, c10::function_ref<void(cudaStream_t)> enqueue);

  const c10::intrusive_ptr<NcclCoreBackend> backend_;
  // Set by tensor_register.
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<nccl_core::Window> window_;
  std::optional<at::Tensor> owned_; // an owning registration's tensor
  // The registered tensor's shape and dtype, for map_remote_tensor.
  std::vector<int64_t> sizes_;
  at::ScalarType dtype_ = at::kByte;
  std::vector<at::ScalarType> peerDtypes_; // every rank's, by rank
};

} // namespace nccl_core

#endif // C10D_BACKEND_HAS_WINDOW

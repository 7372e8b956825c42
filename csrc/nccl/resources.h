// Handles a communicator owns (nccl4py's nccl.core.resources): registered
// buffers, windows and custom reduction ops. Each is tracked by its
// communicator and released by close() (idempotent), when the NCCL memory it
// covers is freed, or when the communicator is destroyed or aborted, whichever
// comes first. A resource refers to its communicator weakly, so it is invalid,
// never dangling, once the communicator is gone.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "nccl/api.h"
#include "nccl/window_layout.h"

namespace nccl_core {

class Communicator;

class CommResource {
 public:
  CommResource(const CommResource&) = delete;
  CommResource& operator=(const CommResource&) = delete;
  virtual ~CommResource() = default;

  // Releases the NCCL handle. Idempotent; never throws.
  void close() noexcept;
  bool isValid() const noexcept {
    return !closed_.load(std::memory_order_acquire);
  }
  // The NCCL allocation this resource covers, if any: freeing that
  // allocation closes the resource first.
  const std::optional<uint64_t>& allocation() const {
    return allocation_;
  }
  virtual const char* kind() const = 0;
  // The owning communicator; null once it is gone.
  std::shared_ptr<Communicator> communicator() const {
    return comm_.lock();
  }

 protected:
  CommResource(
      std::weak_ptr<Communicator> comm,
      std::optional<uint64_t> allocation);
  // Raises RuntimeError saying the resource was closed.
  void requireValid() const;

 private:
  friend class Communicator;
  // Frees the NCCL handle; the communicator calls it once, while alive.
  virtual void release(const NcclApi& api, ncclComm_t comm) noexcept = 0;

  const std::weak_ptr<Communicator> comm_;
  const std::optional<uint64_t> allocation_;
  std::atomic<bool> closed_{false};
};

// ncclCommRegister: a buffer NCCL may use in place (zero-copy).
class RegisteredBuffer final : public CommResource {
 public:
  RegisteredBuffer(
      std::weak_ptr<Communicator> comm,
      std::optional<uint64_t> allocation,
      void* handle,
      size_t size)
      : CommResource(std::move(comm), allocation),
        handle_(handle),
        size_(size) {}

  uintptr_t handle() const;
  size_t size() const {
    return size_;
  }
  const char* kind() const override {
    return "registered buffer";
  }

 private:
  void release(const NcclApi& api, ncclComm_t comm) noexcept override;

  void* const handle_;
  const size_t size_;
};

// ncclCommWindowRegister: memory every rank registered together, which peers
// can address directly (symmetric kernels, one-sided operations).
class Window final : public CommResource {
 public:
  Window(
      std::weak_ptr<Communicator> comm,
      std::optional<uint64_t> allocation,
      ncclWindow_t window,
      void* userPtr,
      size_t size,
      int flags,
      WindowLayout layout)
      : CommResource(std::move(comm), allocation),
        window_(window),
        userPtr_(userPtr),
        size_(size),
        flags_(flags),
        layout_(std::move(layout)) {}

  ncclWindow_t get() const;
  void* userPtr() const;
  size_t size() const {
    return size_;
  }
  int flags() const {
    return flags_;
  }
  // Rank `rank`'s part of the window, as that rank registered it: what its
  // peers' puts and pointers into it are bounded by.
  const WindowPart& part(int rank) const {
    return layout_.at(rank);
  }
  const char* kind() const override {
    return "window";
  }
  // The LSA ranks' base addresses, computed by `query` on first use and
  // kept: one-sided operations need them on every call.
  template <typename Query>
  const std::vector<uintptr_t>& lsaBases(Query&& query) const {
    std::call_once(lsaBasesOnce_, [&] { lsaBases_ = query(); });
    return lsaBases_;
  }

 private:
  void release(const NcclApi& api, ncclComm_t comm) noexcept override;

  mutable std::once_flag lsaBasesOnce_;
  mutable std::vector<uintptr_t> lsaBases_;

  const ncclWindow_t window_;
  void* const userPtr_;
  const size_t size_;
  const int flags_;
  const WindowLayout layout_;
};

// ncclRedOpCreatePreMulSum with a host scalar: output = scalar * sum(inputs),
// valid only on its communicator and for its dtype.
class CustomRedOp final : public CommResource {
 public:
  CustomRedOp(
      std::weak_ptr<Communicator> comm,
      ncclRedOp_t op,
      ncclDataType_t dtype)
      : CommResource(std::move(comm), std::nullopt), op_(op), dtype_(dtype) {}

  ncclRedOp_t get() const;
  ncclDataType_t dtype() const {
    return dtype_;
  }
  // Whether this op belongs to `comm`.
  bool ownedBy(const Communicator& comm) const;
  const char* kind() const override {
    return "custom reduction op";
  }

 private:
  void release(const NcclApi& api, ncclComm_t comm) noexcept override;

  const ncclRedOp_t op_;
  const ncclDataType_t dtype_;
};

} // namespace nccl_core

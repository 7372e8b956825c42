// Reusable CUDA events (timing disabled), so an async op costs no
// cudaEventCreate. Events return to the pool when their holder dies.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

namespace nccl_core {

class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  struct Releaser {
    std::shared_ptr<EventPool> pool;
    void operator()(CUevent_st* event) const;
  };
  using Event = std::unique_ptr<CUevent_st, Releaser>;

  explicit EventPool(int device) : device_(device) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool();

  Event acquire();

 private:
  const int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

} // namespace nccl_core

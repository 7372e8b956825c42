// Lazy window upgrade (Options.window_upgrade): buffers that an all-reduce
// or reduce-scatter runs on again, at sizes where NCCL's symmetric kernels
// beat its ring (policy.h), become symmetric windows of the group's
// communicator, so that the op and the ones after it run on those kernels.
//
// A window is registered by every rank together, and NCCL's symmetric kernels
// need every rank's buffers in windows at the same offset; each rank only
// knows its own memory. So the trigger depends only on what every rank sees
// alike (the op, its sizes, how often the group ran that op shape), and at it
// the ranks vote (a meeting in the group's store, once per op shape): the
// buffers become windows on every rank or on none. Only a buffer that is the
// whole of one tensor's own memory (torch_nccl_core.empty) is upgraded: every
// rank's part then starts at offset 0 of an allocation of one size, as NCCL
// addresses peers' parts (nccl/window_layout.h), and the window goes with the
// tensor. A pool's or torch's segments hand a freed tensor's range to other
// tensors, possibly differently on each rank, whose ops would then find a
// window on one rank and none on another.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "nccl/communicator.h"

namespace nccl_core {

// Every rank's vote, summed: a meeting of the group's ranks.
using AgreeFn = std::function<int64_t(int64_t vote)>;

class WindowUpgrade {
 public:
  explicit WindowUpgrade(Communicator& comm);

  // An op of `type` on `outputs` / `inputs` (none: in place), not coalesced
  // or captured, that NCCL may give symmetric kernels, sized `bytes` as
  // routing sizes it (its largest tensor). On the run of its
  // shape that triggers the vote, asks `agree` and registers the windows the
  // ranks agreed on: collective at that run, and it waits on the host for
  // every rank's vote, as NCCL's window registration waits for every rank.
  void consider(
      c10d::OpType type,
      size_t bytes,
      const std::vector<at::Tensor>& outputs,
      const std::vector<at::Tensor>& inputs,
      const AgreeFn& agree);

  // Windows it registered, and their bytes (closed ones included).
  size_t windows() const {
    return windows_.load();
  }
  size_t windowBytes() const {
    return windowBytes_.load();
  }

  // The run of an op shape at which the ranks vote.
  static constexpr int kVoteAtRun = 3;
  // Op shapes followed per group; later ones are left alone.
  static constexpr size_t kMaxShapes = 64;

 private:
  struct Buffer {
    void* ptr;
    size_t bytes;
    bool operator==(const Buffer& other) const {
      return ptr == other.ptr && bytes == other.bytes;
    }
  };
  using Buffers = c10::SmallVector<Buffer, 2>;
  // An op shape: what every rank's op has alike.
  struct Shape {
    c10d::OpType type;
    size_t outputBytes;
    size_t inputBytes; // the output's, in place
    int runs = 0;
    Buffers last; // this rank's buffers at its last run
  };

  // Whether NCCL can map `buffer` into a window of this group now: one
  // tensor's own NCCL memory (its free closes the window), in no window yet,
  // in one cuMem allocation at an aligned offset.
  bool qualifies(const Buffer& buffer) const;
  // The shape followed for these sizes, added where new; null where
  // kMaxShapes are followed already. Under mutex_.
  Shape* shapeOf(c10d::OpType type, size_t outputBytes, size_t inputBytes);
  // The windows every rank voted for, registered (collective).
  void registerWindows(const Buffers& buffers);

  Communicator& comm_;
  // Held through a vote and its registrations: they are collective, so one
  // at a time on this rank.
  std::mutex mutex_;
  std::vector<Shape> shapes_;
  std::atomic<size_t> windows_{0};
  std::atomic<size_t> windowBytes_{0};
};

} // namespace nccl_core

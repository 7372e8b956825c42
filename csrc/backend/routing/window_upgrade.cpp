#include "backend/routing/window_upgrade.h"

#include <algorithm>

#include "backend/routing/policy.h"
#include "backend/runtime/meetings.h"
#include "nccl/allocations.h"
#include "nccl/window_layout.h"

namespace nccl_core {

WindowUpgrade::WindowUpgrade(Communicator& comm) : comm_(comm) {}

bool WindowUpgrade::qualifies(const Buffer& buffer) const {
  const auto allocation = findAllocation(buffer.ptr, buffer.bytes);
  // The whole of its allocation: where every rank's buffer is (op shapes
  // match), every rank's part starts at offset 0 of an allocation of the
  // same size, as NCCL addresses peers' parts (window_layout.h).
  return allocation && allocation->device == comm_.device() &&
         allocation->perTensor &&
         allocation->base == reinterpret_cast<uintptr_t>(buffer.ptr) &&
         allocation->size == buffer.bytes &&
         !comm_.overlapsWindow(buffer.ptr, buffer.bytes) &&
         comm_.api().windowPlace(buffer.ptr, buffer.bytes).has_value();
}

void WindowUpgrade::consider(
    c10d::OpType type,
    size_t bytes,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    const AgreeFn& agree) {
  if ((type != c10d::OpType::ALLREDUCE &&
       type != c10d::OpType::_REDUCE_SCATTER_BASE) ||
      outputs.size() != 1 || inputs.size() > 1) {
    return;
  }
  const Buffer output{outputs[0].data_ptr(), outputs[0].nbytes()};
  // An in-place all_reduce names its tensor once.
  const Buffer input = inputs.empty()
                           ? output
                           : Buffer{inputs[0].data_ptr(), inputs[0].nbytes()};
  if (!symmetricKernelsWin(type, bytes)) {
    return;
  }
  // One window for one buffer, two for buffers apart; buffers that overlap
  // otherwise get none (an output inside its input would sit at another
  // offset on each rank).
  const auto start = [](const Buffer& b) {
    return reinterpret_cast<uintptr_t>(b.ptr);
  };
  const bool same = output == input;
  const bool apart = start(output) + output.bytes <= start(input) ||
                     start(input) + input.bytes <= start(output);
  Buffers buffers{output};
  if (!same) {
    buffers.push_back(input);
  }

  const std::lock_guard<std::mutex> lock(mutex_);
  Shape* shape = shapeOf(type, output.bytes, input.bytes);
  if (shape == nullptr || shape->runs == kVoteAtRun) {
    return; // followed too many shapes, or voted on already
  }
  const bool repeated = shape->last == buffers;
  shape->last = buffers;
  if (++shape->runs < kVoteAtRun) {
    return;
  }
  // Every rank votes the number of windows it would register: one, or two.
  const bool mine =
      repeated && (same || apart) &&
      std::all_of(buffers.begin(), buffers.end(), [&](const Buffer& b) {
        return qualifies(b);
      });
  const int64_t vote = twoWayVote(mine, buffers.size() == 2, comm_.size());
  if (!unanimous(agree(vote), vote, comm_.size())) {
    return;
  }
  registerWindows(buffers);
}

WindowUpgrade::Shape* WindowUpgrade::shapeOf(
    c10d::OpType type,
    size_t outputBytes,
    size_t inputBytes) {
  const auto shape =
      std::find_if(shapes_.begin(), shapes_.end(), [&](const Shape& s) {
        return s.type == type && s.outputBytes == outputBytes &&
               s.inputBytes == inputBytes;
      });
  if (shape != shapes_.end()) {
    return &*shape;
  }
  if (shapes_.size() == kMaxShapes) {
    return nullptr;
  }
  return &shapes_.emplace_back(Shape{type, outputBytes, inputBytes});
}

void WindowUpgrade::registerWindows(const Buffers& buffers) {
  for (const Buffer& buffer : buffers) {
    // Every rank qualified its buffer: every rank's part is this one's.
    const WindowPlace place =
        *comm_.api().windowPlace(buffer.ptr, buffer.bytes);
    const WindowPart part{
        place.allocationBytes,
        place.offset,
        buffer.bytes,
        NCCL_WIN_COLL_SYMMETRIC};
    // NCCL gives every rank a window or none (a platform without them).
    if (comm_.registerWindow(
            buffer.ptr,
            buffer.bytes,
            NCCL_WIN_COLL_SYMMETRIC,
            WindowLayout(comm_.size(), part))) {
      windows_ += 1;
      windowBytes_ += buffer.bytes;
    }
  }
}

} // namespace nccl_core

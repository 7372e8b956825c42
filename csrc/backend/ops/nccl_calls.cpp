#include "backend/ops/nccl_calls.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include "backend/ops/arguments.h"
#include "nccl/errors.h"

namespace nccl_core::calls {

namespace {

// An NCCL group around several calls, closed on every exit path.
class Group {
 public:
  explicit Group(const NcclTarget& to);
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();
  // ncclGroupEnd, which launches the calls: its result.
  ncclResult_t end();

 private:
  const NcclTarget& to_;
  bool open_ = true;
};

// The op checked the dtype before it ran: this only converts it.
NcclBuffer elementsOf(const at::Tensor& tensor) {
  return bufferOf(tensor, "enqueue");
}

// Data movement needs no dtype: such ops move bytes, so any dtype works.
NcclBuffer bytesOf(const at::Tensor& tensor) {
  return {tensor.data_ptr(), static_cast<size_t>(tensor.nbytes()), ncclUint8};
}

// The calls `call(i)` for i in [0, count), each checked as `name`, in one
// NCCL group (one launch).
template <typename Index, typename Call>
ncclResult_t
inOneGroup(const NcclTarget& to, const char* name, Index count, Call&& call) {
  Group group(to);
  for (Index i = 0; i < count; ++i) {
    to.check(call(i), name);
  }
  return group.end();
}

ncclResult_t
sendBytes(const NcclTarget& to, const void* ptr, size_t bytes, int peer) {
  return to.api().send(ptr, bytes, ncclUint8, peer, to.handle, to.stream);
}

// `in` reduced into `out` on rank `root`.
ncclResult_t reduceTo(
    const NcclTarget& to,
    const NcclBuffer& in,
    void* out,
    ncclRedOp_t op,
    int root) {
  return to.api().reduce(
      in.ptr, out, in.count, in.dtype, op, root, to.handle, to.stream);
}

ncclResult_t
recvBytes(const NcclTarget& to, void* ptr, size_t bytes, int peer) {
  return to.api().recv(ptr, bytes, ncclUint8, peer, to.handle, to.stream);
}

} // namespace

Group::Group(const NcclTarget& to) : to_(to) {
  to_.check(to_.api().groupStart(), "ncclGroupStart");
}

Group::~Group() {
  if (open_) {
    NCCL_CORE_WARN(to_.api(), to_.api().groupEnd());
  }
}

ncclResult_t Group::end() {
  open_ = false;
  return to_.api().groupEnd();
}

ncclResult_t send(const NcclTarget& to, const at::Tensor& tensor, int peer) {
  return sendBytes(to, tensor.data_ptr(), tensor.nbytes(), peer);
}

ncclResult_t recv(const NcclTarget& to, const at::Tensor& tensor, int peer) {
  return recvBytes(to, tensor.data_ptr(), tensor.nbytes(), peer);
}

ncclResult_t
broadcast(const NcclTarget& to, const at::Tensor& tensor, int root) {
  const NcclBuffer buf = bytesOf(tensor);
  return to.api().broadcast(
      buf.ptr, buf.ptr, buf.count, buf.dtype, root, to.handle, to.stream);
}

ncclResult_t
allReduce(const NcclTarget& to, const at::Tensor& tensor, ncclRedOp_t op) {
  const NcclBuffer buf = elementsOf(tensor);
  return to.api().allReduce(
      buf.ptr, buf.ptr, buf.count, buf.dtype, op, to.handle, to.stream);
}

ncclResult_t allReduceCoalesced(
    const NcclTarget& to,
    const std::vector<at::Tensor>& tensors,
    const std::vector<ncclRedOp_t>& ops) {
  return inOneGroup(to, "ncclAllReduce", tensors.size(), [&](size_t i) {
    return allReduce(to, tensors[i], ops[i]);
  });
}

ncclResult_t reduce(
    const NcclTarget& to,
    const at::Tensor& tensor,
    ncclRedOp_t op,
    int root) {
  const NcclBuffer buf = elementsOf(tensor);
  return reduceTo(to, buf, buf.ptr, op, root);
}

namespace {
// Rank `root`'s part of an all-gather into `output`: this rank sends
// `input`, the others receive in place.
ncclResult_t broadcastPart(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input,
    int root) {
  const NcclBuffer out = bytesOf(output);
  const void* send = root == to.comm.rank() ? input.data_ptr() : out.ptr;
  return to.api().broadcast(
      send, out.ptr, out.count, out.dtype, root, to.handle, to.stream);
}
} // namespace

ncclResult_t allGatherList(
    const NcclTarget& to,
    const std::vector<at::Tensor>& list,
    const at::Tensor& input) {
  return inOneGroup(to, "ncclBroadcast", list.size(), [&](size_t r) {
    return broadcastPart(to, list[r], input, static_cast<int>(r));
  });
}

ncclResult_t allGather(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input) {
  const NcclBuffer in = bytesOf(input);
  return to.api().allGather(
      in.ptr, output.data_ptr(), in.count, in.dtype, to.handle, to.stream);
}

ncclResult_t allGatherCoalesced(
    const NcclTarget& to,
    const std::vector<std::vector<at::Tensor>>& lists,
    const std::vector<at::Tensor>& inputs) {
  // Rank r's inputs in order, for every rank r.
  const size_t perRank = inputs.size();
  return inOneGroup(to, "ncclBroadcast", lists.size() * perRank, [&](size_t k) {
    const size_t r = k / perRank;
    const size_t i = k % perRank;
    return broadcastPart(to, lists[r][i], inputs[i], static_cast<int>(r));
  });
}

ncclResult_t allGatherIntoTensors(
    const NcclTarget& to,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs) {
  return inOneGroup(to, "ncclAllGather", inputs.size(), [&](size_t i) {
    return allGather(to, outputs[i], inputs[i]);
  });
}

ncclResult_t reduceScatterList(
    const NcclTarget& to,
    const at::Tensor& output,
    const std::vector<at::Tensor>& list,
    ncclRedOp_t op) {
  const NcclBuffer out = elementsOf(output);
  return inOneGroup(to, "ncclReduce", list.size(), [&](size_t r) {
    return reduceTo(to, elementsOf(list[r]), out.ptr, op, static_cast<int>(r));
  });
}

ncclResult_t reduceScatter(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input,
    ncclRedOp_t op) {
  const NcclBuffer out = elementsOf(output);
  return to.api().reduceScatter(
      input.data_ptr(),
      out.ptr,
      out.count,
      out.dtype,
      op,
      to.handle,
      to.stream);
}

ncclResult_t reduceScatterIntoTensors(
    const NcclTarget& to,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    const std::vector<ncclRedOp_t>& ops) {
  return inOneGroup(to, "ncclReduceScatter", inputs.size(), [&](size_t i) {
    return reduceScatter(to, outputs[i], inputs[i], ops[i]);
  });
}

namespace {
// The root's own part of a gather or scatter: on the current stream (the
// op's, NcclTarget), as flat elements like the parts NCCL moves (the checks
// compare element counts), below autograd as NCCL's writes are.
void copyOwnPart(const at::Tensor& dst, const at::Tensor& src) {
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  dst.view(-1).copy_(src.view(-1), /*non_blocking=*/true);
}
} // namespace

ncclResult_t exchangeWithRoot(
    const NcclTarget& to,
    const std::vector<at::Tensor>& list,
    const at::Tensor& mine,
    int root,
    bool toRoot) {
  Group group(to);
  if (to.comm.rank() != root) {
    if (toRoot) {
      to.check(send(to, mine, root), "ncclSend");
    } else {
      to.check(recv(to, mine, root), "ncclRecv");
    }
    return group.end();
  }
  for (size_t r = 0; r < list.size(); ++r) {
    const auto peer = static_cast<int>(r);
    if (peer == root) {
      copyOwnPart(toRoot ? list[r] : mine, toRoot ? mine : list[r]);
    } else if (toRoot) {
      to.check(recv(to, list[r], peer), "ncclRecv");
    } else {
      to.check(send(to, list[r], peer), "ncclSend");
    }
  }
  return group.end();
}

ncclResult_t allToAll(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input,
    const std::vector<int64_t>& sendCounts,
    const std::vector<int64_t>& recvCounts) {
  const size_t elem = input.element_size();
  auto* in = static_cast<const char*>(input.data_ptr());
  auto* out = static_cast<char*>(output.data_ptr());
  Group group(to);
  for (size_t r = 0; r < sendCounts.size(); ++r) {
    const auto peer = static_cast<int>(r);
    to.check(sendBytes(to, in, sendCounts[r] * elem, peer), "ncclSend");
    to.check(recvBytes(to, out, recvCounts[r] * elem, peer), "ncclRecv");
    in += sendCounts[r] * elem;
    out += recvCounts[r] * elem;
  }
  return group.end();
}

ncclResult_t allToAllList(
    const NcclTarget& to,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs) {
  Group group(to);
  for (size_t r = 0; r < inputs.size(); ++r) {
    const auto peer = static_cast<int>(r);
    to.check(send(to, inputs[r], peer), "ncclSend");
    to.check(recv(to, outputs[r], peer), "ncclRecv");
  }
  return group.end();
}

} // namespace nccl_core::calls

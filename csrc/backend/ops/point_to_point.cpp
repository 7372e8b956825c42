// Ops built from NCCL send/recv: send, recv, gather, scatter and all-to-all.
#include <numeric>
#include <string>

#include "backend/backend.h"
#include "backend/ops/arguments.h"
#include "backend/ops/nccl_calls.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

// The root's per-rank list of a gather ("output") or scatter ("input"): one
// list of `size` tensors of `mine`'s dtype and element count (any shape);
// other ranks pass none.
std::vector<at::Tensor> rootListOf(
    std::vector<std::vector<at::Tensor>>& lists,
    const at::Tensor& mine,
    bool isRoot,
    int size,
    const char* op,
    const std::string& what) {
  if (!isRoot) {
    NCCL_CORE_CHECK_ARG(
        lists.empty() || (lists.size() == 1 && lists.front().empty()),
        op,
        "only the root takes ",
        what,
        " tensors");
    return {};
  }
  NCCL_CORE_CHECK_ARG(
      lists.size() == 1,
      op,
      "the root expects one ",
      what,
      " list, got ",
      lists.size());
  const std::string listName = what + " list";
  checkPerRankList(lists.front(), size, mine, op, listName.c_str());
  for (const auto& tensor : lists.front()) {
    NCCL_CORE_CHECK_ARG(
        tensor.numel() == mine.numel(),
        op,
        "every ",
        what,
        " must have ",
        mine.numel(),
        " elements like the ",
        what == "output" ? "input" : "output",
        ", got ",
        tensor.numel());
  }
  return lists.front();
}

} // namespace

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::send(
    std::vector<at::Tensor>& tensors,
    int dstRank,
    int /*tag*/) {
  return pointToPoint(tensors, dstRank, /*sends=*/true);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::recv(
    std::vector<at::Tensor>& tensors,
    int srcRank,
    int /*tag*/) {
  return pointToPoint(tensors, srcRank, /*sends=*/false);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::pointToPoint(
    std::vector<at::Tensor>& tensors,
    int peer,
    bool sends) {
  const EndCoalescingOnError endOnError(runner_);
  const char* op = sends ? "send" : "recv";
  const at::Tensor& tensor = singleTensor(tensors, op, "tensor");
  communicatorFor(tensor, op, "tensor");
  checkRank(peer, getSize(), op, sends ? "destination rank" : "source rank");
  // Outside a coalesced group nothing could ever match it.
  NCCL_CORE_CHECK_ARG(
      runner_.coalescing() || peer != getRank(),
      op,
      "peer ",
      peer,
      " is this rank; a ",
      op,
      " to itself needs its matching ",
      sends ? "recv" : "send",
      " in the same batch_isend_irecv");
  std::vector<at::Tensor> own{tensor}; // moved into one side of the op
  return runner_.launch(
      OpCall{
          sends ? c10d::OpType::SEND : c10d::OpType::RECV,
          op,
          tensor.device(),
          true,
          c10d::kUnsetTimeout},
      sends ? std::vector<at::Tensor>{} : std::move(own),
      sends ? std::move(own) : std::vector<at::Tensor>{},
      [&](const NcclTarget& to) {
        return sends ? calls::send(to, tensor, peer)
                     : calls::recv(to, tensor, peer);
      },
      LaunchOptions::withPeer(peer));
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::recvAnysource(
    std::vector<at::Tensor>& /*tensors*/,
    int /*tag*/) {
  const EndCoalescingOnError endOnError(runner_);
  C10_THROW_ERROR(
      NotImplementedError,
      "nccl_core recv: receiving from any source is not supported, since NCCL "
      "has no wildcard receive; pass src=");
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return exchangeWithRoot(outputs, inputs, opts, /*toRoot=*/true);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return exchangeWithRoot(inputs, outputs, opts, /*toRoot=*/false);
}

template <typename Opts>
c10::intrusive_ptr<c10d::Work> NcclCoreBackend::exchangeWithRoot(
    std::vector<std::vector<at::Tensor>>& lists,
    std::vector<at::Tensor>& mine,
    const Opts& opts,
    bool toRoot) {
  const EndCoalescingOnError endOnError(runner_);
  const char* op = toRoot ? "gather" : "scatter";
  const char* mineIs = toRoot ? "input" : "output";
  const at::Tensor& tensor = singleTensor(mine, op, mineIs);
  communicatorFor(tensor, op, mineIs);
  checkRank(opts.rootRank, getSize(), op, "root");
  const int root = static_cast<int>(opts.rootRank);
  const std::vector<at::Tensor> list = rootListOf(
      lists,
      tensor,
      getRank() == root,
      getSize(),
      op,
      toRoot ? "output" : "input");
  std::vector<at::Tensor> own{tensor};
  return runner_.launch(
      OpCall::of(
          toRoot ? c10d::OpType::GATHER : c10d::OpType::SCATTER,
          op,
          tensor,
          opts),
      toRoot ? list : std::move(own),
      toRoot ? std::move(own) : list,
      [&](const NcclTarget& to) {
        return calls::exchangeWithRoot(to, list, tensor, root, toRoot);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits,
    const c10d::AllToAllOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "alltoall_base";
  const Communicator& comm = communicatorFor(input, kOp, "input");
  checkOutput(output, input, deviceOf(comm), kOp);
  const std::vector<int64_t> sendCounts =
      allToAllCounts(input, inputSplits, getSize(), "input");
  const std::vector<int64_t> recvCounts =
      allToAllCounts(output, outputSplits, getSize(), "output");
  return runner_.launch(
      OpCall::of(c10d::OpType::ALLTOALL_BASE, kOp, input, opts),
      {output},
      {input},
      [&](const NcclTarget& to) {
        return calls::allToAll(to, output, input, sendCounts, recvCounts);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "alltoall";
  NCCL_CORE_CHECK_ARG(
      !inputs.empty(), kOp, "expected one input per rank, got none");
  communicatorFor(inputs.front(), kOp, "input");
  checkPerRankList(inputs, getSize(), inputs.front(), kOp, "input list");
  checkPerRankList(outputs, getSize(), inputs.front(), kOp, "output list");
  return runner_.launch(
      OpCall::of(c10d::OpType::ALLTOALL, kOp, inputs.front(), opts),
      outputs,
      inputs,
      [&](const NcclTarget& to) {
        return calls::allToAllList(to, outputs, inputs);
      });
}

} // namespace nccl_core

// Ops built from NCCL send/recv: send, recv, gather, scatter and all-to-all.
#include <c10/util/safe_numerics.h>

#include <numeric>
#include <string>

#include "backend/launch.h"
#include "backend/ops/arguments.h"
#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

// Point-to-point ops move bytes: any dtype works.
ncclResult_t sendBytes(
    const NcclApi& api,
    const void* ptr,
    size_t bytes,
    int peer,
    ncclComm_t comm,
    cudaStream_t stream) {
  return api.send(ptr, bytes, ncclUint8, peer, comm, stream);
}

ncclResult_t recvBytes(
    const NcclApi& api,
    void* ptr,
    size_t bytes,
    int peer,
    ncclComm_t comm,
    cudaStream_t stream) {
  return api.recv(ptr, bytes, ncclUint8, peer, comm, stream);
}

// A gather (`toRoot`) or a scatter: the root moves list[r] from or to rank
// r, by a device copy for itself; every other rank sends or receives `mine`.
struct RootExchange {
  int root;
  std::vector<at::Tensor> list; // the root's; empty elsewhere
  at::Tensor mine;
  bool toRoot;

  ncclResult_t enqueue(
      const NcclApi& api,
      int rank,
      int size,
      ncclComm_t comm,
      cudaStream_t stream) const {
    NcclGroup group(api);
    if (rank != root) {
      NCCL_CORE_CHECK(
          toRoot
              ? sendBytes(
                    api, mine.data_ptr(), mine.nbytes(), root, comm, stream)
              : recvBytes(
                    api, mine.data_ptr(), mine.nbytes(), root, comm, stream));
      return group.end();
    }
    for (int r = 0; r < size; ++r) {
      void* theirs = list[r].data_ptr();
      if (r == root) {
        C10_CUDA_CHECK(cudaMemcpyAsync(
            toRoot ? theirs : mine.data_ptr(),
            toRoot ? mine.data_ptr() : theirs,
            mine.nbytes(),
            cudaMemcpyDeviceToDevice,
            stream));
      } else {
        NCCL_CORE_CHECK(
            toRoot ? recvBytes(api, theirs, list[r].nbytes(), r, comm, stream)
                   : sendBytes(api, theirs, list[r].nbytes(), r, comm, stream));
      }
    }
    return group.end();
  }
};

// The root's per-rank list of a gather ("output") or scatter ("input"): one
// list of `size` tensors shaped like `mine`; other ranks pass none.
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

constexpr const char* kAllToAll = "alltoall_base";

// Per-rank element counts of an all-to-all side without splits: equal parts.
std::vector<int64_t>
evenCounts(const at::Tensor& tensor, int worldSize, const char* what) {
  NCCL_CORE_CHECK_ARG(
      tensor.numel() % worldSize == 0,
      kAllToAll,
      what,
      " has ",
      tensor.numel(),
      " elements, not divisible by the world size ",
      worldSize);
  return std::vector<int64_t>(worldSize, tensor.numel() / worldSize);
}

// Per-rank element counts of an all-to-all side, split along dim 0.
std::vector<int64_t> splitCounts(
    const at::Tensor& tensor,
    const std::vector<int64_t>& splits,
    int worldSize,
    const char* what) {
  if (splits.empty()) {
    return evenCounts(tensor, worldSize, what);
  }
  NCCL_CORE_CHECK_ARG(
      tensor.dim() >= 1, kAllToAll, what, " splits need a dim 0");
  const int64_t rows = tensor.size(0);
  const int64_t rowElems = rows == 0 ? 0 : tensor.numel() / rows;
  std::vector<int64_t> counts(worldSize);
  NCCL_CORE_CHECK_ARG(
      static_cast<int>(splits.size()) == worldSize,
      kAllToAll,
      "expected one ",
      what,
      " split per rank (",
      worldSize,
      "), got ",
      splits.size());
  int64_t total = 0;
  for (int r = 0; r < worldSize; ++r) {
    NCCL_CORE_CHECK_ARG(
        splits[r] >= 0,
        kAllToAll,
        what,
        " splits must be >= 0, got ",
        splits[r]);
    // Overflow-checked: a split near INT64_MAX must not wrap into a sum
    // that matches dim 0.
    NCCL_CORE_CHECK_ARG(
        !c10::add_overflows(total, splits[r], &total) &&
            !c10::mul_overflows(splits[r], rowElems, &counts[r]),
        kAllToAll,
        what,
        " splits overflow int64 (split ",
        r,
        " is ",
        splits[r],
        ")");
  }
  NCCL_CORE_CHECK_ARG(
      total == rows,
      kAllToAll,
      what,
      " splits sum to ",
      total,
      " but dim 0 of the ",
      what,
      " is ",
      rows);
  return counts;
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
  const EndCoalescingOnError endOnError(*this);
  const char* op = sends ? "send" : "recv";
  const at::Tensor& tensor = singleTensor(tensors, op, "tensor");
  deviceForOp(tensor, op, "tensor");
  checkRank(peer, getSize(), op, sends ? "destination rank" : "source rank");
  // Outside a coalesced group nothing could ever match it.
  NCCL_CORE_CHECK_ARG(
      coalescing_ || peer != getRank(),
      op,
      "peer ",
      peer,
      " is this rank; a ",
      op,
      " to itself needs its matching ",
      sends ? "recv" : "send",
      " in the same batch_isend_irecv");
  std::vector<at::Tensor> own{tensor}; // moved into one side of the op
  return launch(
      OpCall{
          sends ? c10d::OpType::SEND : c10d::OpType::RECV,
          op,
          tensor.device(),
          true,
          c10d::kUnsetTimeout},
      sends ? std::vector<at::Tensor>{} : std::move(own),
      sends ? std::move(own) : std::vector<at::Tensor>{},
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        void* data = tensor.data_ptr();
        const size_t bytes = tensor.nbytes();
        return sends ? sendBytes(api, data, bytes, peer, comm, stream)
                     : recvBytes(api, data, bytes, peer, comm, stream);
      },
      LaunchOptions::withPeer(peer));
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::recvAnysource(
    std::vector<at::Tensor>& /*tensors*/,
    int /*tag*/) {
  const EndCoalescingOnError endOnError(*this);
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
  const EndCoalescingOnError endOnError(*this);
  const char* op = toRoot ? "gather" : "scatter";
  const char* mineIs = toRoot ? "input" : "output";
  const at::Tensor& tensor = singleTensor(mine, op, mineIs);
  deviceForOp(tensor, op, mineIs);
  checkRank(opts.rootRank, getSize(), op, "root");
  const int root = static_cast<int>(opts.rootRank);
  const RootExchange exchange{
      root,
      rootListOf(
          lists,
          tensor,
          getRank() == root,
          getSize(),
          op,
          toRoot ? "output" : "input"),
      tensor,
      toRoot};
  std::vector<at::Tensor> own{tensor};
  return launch(
      OpCall::of(
          toRoot ? c10d::OpType::GATHER : c10d::OpType::SCATTER,
          op,
          tensor,
          opts),
      toRoot ? std::vector<at::Tensor>(exchange.list) : std::move(own),
      toRoot ? std::move(own) : std::vector<at::Tensor>(exchange.list),
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return exchange.enqueue(api, getRank(), getSize(), comm, stream);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits,
    const c10d::AllToAllOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "alltoall_base";
  const c10::DeviceIndex device = deviceForOp(input, kOp, "input");
  checkOutput(output, input, device, kOp);
  const std::vector<int64_t> sendCounts =
      splitCounts(input, inputSplits, getSize(), "input");
  const std::vector<int64_t> recvCounts =
      splitCounts(output, outputSplits, getSize(), "output");
  const size_t elem = input.element_size();
  return launch(
      OpCall::of(c10d::OpType::ALLTOALL_BASE, kOp, input, opts),
      {output},
      {input},
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        NcclGroup group(api);
        auto* in = static_cast<const char*>(input.data_ptr());
        auto* out = static_cast<char*>(output.data_ptr());
        for (int r = 0; r < getSize(); ++r) {
          NCCL_CORE_CHECK(
              sendBytes(api, in, sendCounts[r] * elem, r, comm, stream));
          NCCL_CORE_CHECK(
              recvBytes(api, out, recvCounts[r] * elem, r, comm, stream));
          in += sendCounts[r] * elem;
          out += recvCounts[r] * elem;
        }
        return group.end();
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "alltoall";
  NCCL_CORE_CHECK_ARG(
      !inputs.empty(), kOp, "expected one input per rank, got none");
  deviceForOp(inputs.front(), kOp, "input");
  checkPerRankList(inputs, getSize(), inputs.front(), kOp, "input list");
  checkPerRankList(outputs, getSize(), inputs.front(), kOp, "output list");
  return launch(
      OpCall::of(c10d::OpType::ALLTOALL, kOp, inputs.front(), opts),
      outputs,
      inputs,
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        NcclGroup group(api);
        for (int r = 0; r < getSize(); ++r) {
          NCCL_CORE_CHECK(sendBytes(
              api, inputs[r].data_ptr(), inputs[r].nbytes(), r, comm, stream));
          NCCL_CORE_CHECK(recvBytes(
              api,
              outputs[r].data_ptr(),
              outputs[r].nbytes(),
              r,
              comm,
              stream));
        }
        return group.end();
      });
}

} // namespace nccl_core

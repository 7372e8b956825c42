// Ops built from NCCL send/recv: send, recv, gather, scatter and all-to-all.
#include <c10/util/safe_numerics.h>

#include <numeric>

#include "backend/dispatch.h"
#include "backend/launch.h"
#include "nccl/api.h"

namespace nccl_core {

namespace {

// Point-to-point ops move bytes: any dtype works.
ncclResult_t sendBytes(
    const void* ptr,
    size_t bytes,
    int peer,
    ncclComm_t comm,
    cudaStream_t stream) {
  return nccl().send(ptr, bytes, ncclUint8, peer, comm, stream);
}

ncclResult_t recvBytes(
    void* ptr,
    size_t bytes,
    int peer,
    ncclComm_t comm,
    cudaStream_t stream) {
  return nccl().recv(ptr, bytes, ncclUint8, peer, comm, stream);
}

// Per-rank element counts of an all-to-all side, split along dim 0.
std::vector<int64_t> splitCounts(
    const at::Tensor& tensor,
    const std::vector<int64_t>& splits,
    int worldSize,
    const char* what) {
  constexpr const char* kOp = "alltoall_base";
  TORCH_CHECK_VALUE(
      tensor.dim() >= 1 || splits.empty(),
      "nccl_core ",
      kOp,
      ": ",
      what,
      " splits need a dim 0");
  const int64_t rows = tensor.dim() >= 1 ? tensor.size(0) : tensor.numel();
  const int64_t rowElems = rows == 0 ? 0 : tensor.numel() / rows;
  std::vector<int64_t> counts(worldSize);
  if (splits.empty()) {
    TORCH_CHECK_VALUE(
        tensor.numel() % worldSize == 0,
        "nccl_core ",
        kOp,
        ": ",
        what,
        " has ",
        tensor.numel(),
        " elements, not divisible by the world size ",
        worldSize);
    std::fill(counts.begin(), counts.end(), tensor.numel() / worldSize);
    return counts;
  }
  TORCH_CHECK_VALUE(
      static_cast<int>(splits.size()) == worldSize,
      "nccl_core ",
      kOp,
      ": expected one ",
      what,
      " split per rank (",
      worldSize,
      "), got ",
      splits.size());
  int64_t total = 0;
  for (int r = 0; r < worldSize; ++r) {
    TORCH_CHECK_VALUE(
        splits[r] >= 0,
        "nccl_core ",
        kOp,
        ": ",
        what,
        " splits must be >= 0, got ",
        splits[r]);
    // Overflow-checked: a split near INT64_MAX must not wrap into a sum
    // that matches dim 0.
    TORCH_CHECK_VALUE(
        !c10::add_overflows(total, splits[r], &total) &&
            !c10::mul_overflows(splits[r], rowElems, &counts[r]),
        "nccl_core ",
        kOp,
        ": ",
        what,
        " splits overflow int64 (split ",
        r,
        " is ",
        splits[r],
        ")");
  }
  TORCH_CHECK_VALUE(
      total == rows,
      "nccl_core ",
      kOp,
      ": ",
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
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "send";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  checkedDevice(tensor, kOp, "tensor");
  checkRank(dstRank, getSize(), kOp, "destination rank");
  // Outside a coalesced group nothing could ever match it.
  TORCH_CHECK_VALUE(
      coalescing_ || dstRank != getRank(),
      "nccl_core send: peer ",
      dstRank,
      " is this rank; a send to itself needs its matching recv in the same "
      "batch_isend_irecv");
  return launch(
      c10d::OpType::SEND,
      kOp,
      tensor.device(),
      true,
      c10d::kUnsetTimeout,
      {},
      {tensor},
      [&](ncclComm_t comm, cudaStream_t stream) {
        return sendBytes(
            tensor.data_ptr(), tensor.nbytes(), dstRank, comm, stream);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::recv(
    std::vector<at::Tensor>& tensors,
    int srcRank,
    int /*tag*/) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "recv";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  checkedDevice(tensor, kOp, "tensor");
  checkRank(srcRank, getSize(), kOp, "source rank");
  // Outside a coalesced group nothing could ever match it.
  TORCH_CHECK_VALUE(
      coalescing_ || srcRank != getRank(),
      "nccl_core recv: peer ",
      srcRank,
      " is this rank; a recv to itself needs its matching send in the same "
      "batch_isend_irecv");
  return launch(
      c10d::OpType::RECV,
      kOp,
      tensor.device(),
      true,
      c10d::kUnsetTimeout,
      {tensor},
      {},
      [&](ncclComm_t comm, cudaStream_t stream) {
        return recvBytes(
            tensor.data_ptr(), tensor.nbytes(), srcRank, comm, stream);
      });
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
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "gather";
  const at::Tensor& input = singleTensor(inputs, kOp, "input");
  const c10::DeviceIndex device = checkedDevice(input, kOp, "input");
  checkRank(opts.rootRank, getSize(), kOp, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = getRank() == root;
  std::vector<at::Tensor> list;
  if (isRoot) {
    TORCH_CHECK_VALUE(
        outputs.size() == 1,
        "nccl_core ",
        kOp,
        ": the root expects one output list, got ",
        outputs.size());
    list = outputs.front();
    checkPerRankList(
        list, getSize(), device, input.scalar_type(), kOp, "output list");
    for (const auto& out : list) {
      TORCH_CHECK_VALUE(
          out.numel() == input.numel(),
          "nccl_core ",
          kOp,
          ": every output must have ",
          input.numel(),
          " elements like the input, got ",
          out.numel());
    }
  } else {
    TORCH_CHECK_VALUE(
        outputs.empty() || (outputs.size() == 1 && outputs.front().empty()),
        "nccl_core ",
        kOp,
        ": only the root takes output tensors");
  }
  return launch(
      c10d::OpType::GATHER,
      kOp,
      input.device(),
      opts.asyncOp,
      opts.timeout,
      list,
      {input},
      [&](ncclComm_t comm, cudaStream_t stream) {
        NcclGroup group;
        if (isRoot) {
          for (int r = 0; r < getSize(); ++r) {
            if (r == root) {
              C10_CUDA_CHECK(cudaMemcpyAsync(
                  list[r].data_ptr(),
                  input.data_ptr(),
                  input.nbytes(),
                  cudaMemcpyDeviceToDevice,
                  stream));
            } else {
              NCCL_CORE_CHECK(recvBytes(
                  list[r].data_ptr(), list[r].nbytes(), r, comm, stream));
            }
          }
        } else {
          NCCL_CORE_CHECK(
              sendBytes(input.data_ptr(), input.nbytes(), root, comm, stream));
        }
        return group.end();
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "scatter";
  const at::Tensor& output = singleTensor(outputs, kOp, "output");
  const c10::DeviceIndex device = checkedDevice(output, kOp, "output");
  checkRank(opts.rootRank, getSize(), kOp, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = getRank() == root;
  std::vector<at::Tensor> list;
  if (isRoot) {
    TORCH_CHECK_VALUE(
        inputs.size() == 1,
        "nccl_core ",
        kOp,
        ": the root expects one input list, got ",
        inputs.size());
    list = inputs.front();
    checkPerRankList(
        list, getSize(), device, output.scalar_type(), kOp, "input list");
    for (const auto& in : list) {
      TORCH_CHECK_VALUE(
          in.numel() == output.numel(),
          "nccl_core ",
          kOp,
          ": every input must have ",
          output.numel(),
          " elements like the output, got ",
          in.numel());
    }
  } else {
    TORCH_CHECK_VALUE(
        inputs.empty() || (inputs.size() == 1 && inputs.front().empty()),
        "nccl_core ",
        kOp,
        ": only the root takes input tensors");
  }
  return launch(
      c10d::OpType::SCATTER,
      kOp,
      output.device(),
      opts.asyncOp,
      opts.timeout,
      {output},
      list,
      [&](ncclComm_t comm, cudaStream_t stream) {
        NcclGroup group;
        if (isRoot) {
          for (int r = 0; r < getSize(); ++r) {
            if (r == root) {
              C10_CUDA_CHECK(cudaMemcpyAsync(
                  output.data_ptr(),
                  list[r].data_ptr(),
                  output.nbytes(),
                  cudaMemcpyDeviceToDevice,
                  stream));
            } else {
              NCCL_CORE_CHECK(sendBytes(
                  list[r].data_ptr(), list[r].nbytes(), r, comm, stream));
            }
          }
        } else {
          NCCL_CORE_CHECK(recvBytes(
              output.data_ptr(), output.nbytes(), root, comm, stream));
        }
        return group.end();
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
  const c10::DeviceIndex device = checkedDevice(input, kOp, "input");
  checkTensor(output, device, kOp, "output");
  checkSameDtype(input, output, kOp);
  const std::vector<int64_t> sendCounts =
      splitCounts(input, inputSplits, getSize(), "input");
  const std::vector<int64_t> recvCounts =
      splitCounts(output, outputSplits, getSize(), "output");
  const size_t elem = input.element_size();
  return launch(
      c10d::OpType::ALLTOALL_BASE,
      kOp,
      input.device(),
      opts.asyncOp,
      opts.timeout,
      {output},
      {input},
      [&](ncclComm_t comm, cudaStream_t stream) {
        NcclGroup group;
        auto* in = static_cast<const char*>(input.data_ptr());
        auto* out = static_cast<char*>(output.data_ptr());
        for (int r = 0; r < getSize(); ++r) {
          NCCL_CORE_CHECK(sendBytes(in, sendCounts[r] * elem, r, comm, stream));
          NCCL_CORE_CHECK(
              recvBytes(out, recvCounts[r] * elem, r, comm, stream));
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
  TORCH_CHECK_VALUE(
      !inputs.empty(),
      "nccl_core ",
      kOp,
      ": expected one input per rank, got none");
  const c10::DeviceIndex device = checkedDevice(inputs.front(), kOp, "input");
  const at::ScalarType dtype = inputs.front().scalar_type();
  checkPerRankList(inputs, getSize(), device, dtype, kOp, "input list");
  checkPerRankList(outputs, getSize(), device, dtype, kOp, "output list");
  return launch(
      c10d::OpType::ALLTOALL,
      kOp,
      inputs.front().device(),
      opts.asyncOp,
      opts.timeout,
      outputs,
      inputs,
      [&](ncclComm_t comm, cudaStream_t stream) {
        NcclGroup group;
        for (int r = 0; r < getSize(); ++r) {
          NCCL_CORE_CHECK(sendBytes(
              inputs[r].data_ptr(), inputs[r].nbytes(), r, comm, stream));
          NCCL_CORE_CHECK(recvBytes(
              outputs[r].data_ptr(), outputs[r].nbytes(), r, comm, stream));
        }
        return group.end();
      });
}

} // namespace nccl_core

// Collectives of NcclCoreBackend. Each one checks its arguments, then hands
// launch() the NCCL calls to enqueue.
#include <memory>

#include "backend/launch.h"
#include "backend/ops/arguments.h"
#include "backend/ops/reduce_op.h"
#include "nccl/api.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

// Data movement needs no dtype: such ops move bytes, so any dtype works.
NcclBuffer bytesOf(const at::Tensor& tensor) {
  return {tensor.data_ptr(), static_cast<size_t>(tensor.nbytes()), ncclUint8};
}

std::vector<at::Tensor>
withFactor(std::vector<at::Tensor> tensors, const NcclReduceOp& op) {
  if (op.factor().defined()) {
    tensors.push_back(op.factor());
  }
  return tensors;
}

void checkNumel(
    const at::Tensor& tensor,
    int64_t expected,
    const char* op,
    const char* what) {
  NCCL_CORE_CHECK_ARG(
      tensor.numel() == expected,
      op,
      what,
      " has ",
      tensor.numel(),
      " elements, expected ",
      expected);
}

void checkRootTensor(int64_t rootTensor, const char* op) {
  NCCL_CORE_CHECK_ARG(
      rootTensor == 0,
      op,
      "rootTensor must be 0 (one tensor per process), got ",
      rootTensor);
}

} // namespace

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::broadcast(
    std::vector<at::Tensor>& tensors,
    const c10d::BroadcastOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "broadcast";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  deviceForOp(tensor, kOp, "tensor");
  checkRank(opts.rootRank, getSize(), kOp, "root");
  checkRootTensor(opts.rootTensor, kOp);
  const NcclBuffer buf = bytesOf(tensor);
  const int root = static_cast<int>(opts.rootRank);
  LaunchOptions options = LaunchOptions::routed();
  options.sendsData = getRank() == root;
  return launch(
      OpCall::of(c10d::OpType::BROADCAST, kOp, tensor, opts),
      {tensor},
      {},
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return api.broadcast(
            buf.ptr, buf.ptr, buf.count, buf.dtype, root, comm, stream);
      },
      options);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "allreduce";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  deviceForOp(tensor, kOp, "tensor");
  const NcclBuffer buf = bufferOf(tensor, kOp);
  const NcclReduceOp op(opts.reduceOp, tensor, *comm_, kOp);
  const LaunchOptions options =
      LaunchOptions::reducing(opts.reduceOp, op.isBuiltin());
  return launch(
      OpCall::of(c10d::OpType::ALLREDUCE, kOp, tensor, opts),
      {tensor},
      withFactor({}, op),
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return api.allReduce(
            buf.ptr, buf.ptr, buf.count, buf.dtype, op.get(), comm, stream);
      },
      options);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "allreduce_coalesced";
  NCCL_CORE_CHECK_ARG(!tensors.empty(), kOp, "expected at least one tensor");
  std::vector<NcclBuffer> bufs;
  std::vector<std::unique_ptr<NcclReduceOp>> ops;
  std::vector<at::Tensor> factors;
  for (const auto& tensor : tensors) {
    deviceForOp(tensor, kOp, "tensor");
    NCCL_CORE_CHECK_ARG(
        tensor.device() == tensors.front().device(),
        kOp,
        "all tensors must be on one device");
    bufs.push_back(bufferOf(tensor, kOp));
    ops.push_back(
        std::make_unique<NcclReduceOp>(opts.reduceOp, tensor, *comm_, kOp));
    factors = withFactor(std::move(factors), *ops.back());
  }
  return launch(
      OpCall::of(c10d::OpType::ALLREDUCE_COALESCED, kOp, tensors.front(), opts),
      tensors,
      factors,
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return inOneGroup(api, "ncclAllReduce", bufs.size(), [&](size_t i) {
          const NcclBuffer& buf = bufs[i];
          return api.allReduce(
              buf.ptr,
              buf.ptr,
              buf.count,
              buf.dtype,
              ops[i]->get(),
              comm,
              stream);
        });
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::reduce(
    std::vector<at::Tensor>& tensors,
    const c10d::ReduceOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "reduce";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  deviceForOp(tensor, kOp, "tensor");
  checkRank(opts.rootRank, getSize(), kOp, "root");
  checkRootTensor(opts.rootTensor, kOp);
  const NcclBuffer buf = bufferOf(tensor, kOp);
  const NcclReduceOp op(opts.reduceOp, tensor, *comm_, kOp);
  const int root = static_cast<int>(opts.rootRank);
  return launch(
      OpCall::of(c10d::OpType::REDUCE, kOp, tensor, opts),
      {tensor},
      withFactor({}, op),
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return api.reduce(
            buf.ptr,
            buf.ptr,
            buf.count,
            buf.dtype,
            op.get(),
            root,
            comm,
            stream);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "allgather";
  const at::Tensor& input = singleTensor(inputs, kOp, "input");
  deviceForOp(input, kOp, "input");
  NCCL_CORE_CHECK_ARG(
      outputs.size() == 1,
      kOp,
      "expected one output list, got ",
      outputs.size());
  std::vector<at::Tensor>& list = outputs.front();
  checkPerRankList(list, getSize(), input, kOp, "output list");
  checkNumel(list[getRank()], input.numel(), kOp, "this rank's output");
  // One broadcast per rank in a group: also gathers tensors of different
  // sizes per rank.
  return launch(
      OpCall::of(c10d::OpType::ALLGATHER, kOp, input, opts),
      list,
      {input},
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return inOneGroup(api, "ncclBroadcast", getSize(), [&](int r) {
          const NcclBuffer out = bytesOf(list[r]);
          const void* send = r == getRank() ? input.data_ptr() : out.ptr;
          return api.broadcast(
              send, out.ptr, out.count, out.dtype, r, comm, stream);
        });
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::_allgather_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "allgather_into_tensor";
  const c10::DeviceIndex device = deviceForOp(input, kOp, "input");
  checkOutput(output, input, device, kOp);
  checkNumel(output, input.numel() * getSize(), kOp, "output");
  const NcclBuffer in = bytesOf(input);
  void* out = output.data_ptr();
  return launch(
      OpCall::of(c10d::OpType::_ALLGATHER_BASE, kOp, input, opts),
      {output},
      {input},
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return api.allGather(in.ptr, out, in.count, in.dtype, comm, stream);
      },
      LaunchOptions::gathering());
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "allgather_coalesced";
  NCCL_CORE_CHECK_ARG(!inputs.empty(), kOp, "expected at least one input");
  NCCL_CORE_CHECK_ARG(
      static_cast<int>(outputLists.size()) == getSize(),
      kOp,
      "expected one output list per rank (",
      getSize(),
      "), got ",
      outputLists.size());
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::DeviceIndex device = deviceForOp(inputs[i], kOp, "input");
    for (auto& list : outputLists) {
      NCCL_CORE_CHECK_ARG(
          list.size() == inputs.size(),
          kOp,
          "every output list must hold ",
          inputs.size(),
          " tensors, got ",
          list.size());
      checkOutput(list[i], inputs[i], device, kOp);
      checkNumel(list[i], inputs[i].numel(), kOp, "output");
      outputs.push_back(list[i]);
    }
  }
  return launch(
      OpCall::of(c10d::OpType::ALLGATHER_COALESCED, kOp, inputs.front(), opts),
      outputs,
      inputs,
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        // Rank r's inputs in order, for every rank r.
        const size_t perRank = inputs.size();
        return inOneGroup(
            api, "ncclBroadcast", getSize() * perRank, [&](size_t k) {
              const int r = static_cast<int>(k / perRank);
              const size_t i = k % perRank;
              const NcclBuffer out = bytesOf(outputLists[r][i]);
              const void* send =
                  r == getRank() ? inputs[i].data_ptr() : out.ptr;
              return api.broadcast(
                  send, out.ptr, out.count, out.dtype, r, comm, stream);
            });
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "allgather_into_tensor_coalesced";
  checkPaired(outputs, inputs, kOp);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::DeviceIndex device = deviceForOp(inputs[i], kOp, "input");
    checkOutput(outputs[i], inputs[i], device, kOp);
    checkNumel(outputs[i], inputs[i].numel() * getSize(), kOp, "output");
  }
  return launch(
      OpCall::of(c10d::OpType::COALESCED, kOp, inputs.front(), opts),
      outputs,
      inputs,
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return inOneGroup(api, "ncclAllGather", inputs.size(), [&](size_t i) {
          const NcclBuffer in = bytesOf(inputs[i]);
          return api.allGather(
              in.ptr, outputs[i].data_ptr(), in.count, in.dtype, comm, stream);
        });
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "reduce_scatter";
  const at::Tensor& output = singleTensor(outputs, kOp, "output");
  deviceForOp(output, kOp, "output");
  NCCL_CORE_CHECK_ARG(
      inputs.size() == 1, kOp, "expected one input list, got ", inputs.size());
  std::vector<at::Tensor>& list = inputs.front();
  checkPerRankList(list, getSize(), output, kOp, "input list");
  checkNumel(list[getRank()], output.numel(), kOp, "this rank's input");
  const NcclBuffer out = bufferOf(output, kOp);
  const NcclReduceOp op(opts.reduceOp, output, *comm_, kOp);
  // One reduce per rank in a group: also handles sizes that differ per rank.
  return launch(
      OpCall::of(c10d::OpType::REDUCE_SCATTER, kOp, output, opts),
      {output},
      withFactor(list, op),
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return inOneGroup(api, "ncclReduce", getSize(), [&](int r) {
          const NcclBuffer in = bufferOf(list[r], kOp);
          return api.reduce(
              in.ptr, out.ptr, in.count, in.dtype, op.get(), r, comm, stream);
        });
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "reduce_scatter_tensor";
  const c10::DeviceIndex device = deviceForOp(input, kOp, "input");
  checkOutput(output, input, device, kOp);
  checkNumel(input, output.numel() * getSize(), kOp, "input");
  const NcclBuffer out = bufferOf(output, kOp);
  void* in = input.data_ptr();
  const NcclReduceOp op(opts.reduceOp, output, *comm_, kOp);
  const LaunchOptions options =
      LaunchOptions::reducing(opts.reduceOp, op.isBuiltin());
  return launch(
      OpCall::of(c10d::OpType::_REDUCE_SCATTER_BASE, kOp, input, opts),
      {output},
      withFactor({input}, op),
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return api.reduceScatter(
            in, out.ptr, out.count, out.dtype, op.get(), comm, stream);
      },
      options);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  constexpr const char* kOp = "reduce_scatter_tensor_coalesced";
  checkPaired(outputs, inputs, kOp);
  std::vector<std::unique_ptr<NcclReduceOp>> ops;
  std::vector<at::Tensor> stash = inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::DeviceIndex device = deviceForOp(inputs[i], kOp, "input");
    checkOutput(outputs[i], inputs[i], device, kOp);
    checkNumel(inputs[i], outputs[i].numel() * getSize(), kOp, "input");
    bufferOf(outputs[i], kOp); // dtype check before any NCCL call
    ops.push_back(
        std::make_unique<NcclReduceOp>(opts.reduceOp, outputs[i], *comm_, kOp));
    stash = withFactor(std::move(stash), *ops.back());
  }
  return launch(
      OpCall::of(c10d::OpType::COALESCED, kOp, inputs.front(), opts),
      outputs,
      stash,
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return inOneGroup(
            api, "ncclReduceScatter", inputs.size(), [&](size_t i) {
              const NcclBuffer out = bufferOf(outputs[i], kOp);
              return api.reduceScatter(
                  inputs[i].data_ptr(),
                  out.ptr,
                  out.count,
                  out.dtype,
                  ops[i]->get(),
                  comm,
                  stream);
            });
      });
}

c10::intrusive_ptr<c10d::Work>
NcclCoreBackend::barrier(const c10d::BarrierOptions& opts) {
  const EndCoalescingOnError endOnError(*this);
  Communicator& comm = communicator(deviceForOpWithoutTensors(opts.device_ids));
  const at::Device device(
      at::kCUDA, static_cast<c10::DeviceIndex>(comm.device()));
  if (!barrierToken_.defined()) {
    // Its value is never read: only the all-reduce's completion matters.
    barrierToken_ =
        at::zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat));
  }
  LaunchOptions options = LaunchOptions::blockingHost();
  options.sendsData = false; // the token is no data of the caller's
  void* token = barrierToken_.data_ptr();
  // wait() on a barrier blocks the host until every rank has arrived.
  return launch(
      OpCall{c10d::OpType::BARRIER, "barrier", device, true, opts.timeout},
      {},
      {barrierToken_},
      [&](const NcclApi& api, ncclComm_t comm, cudaStream_t stream) {
        return api.allReduce(
            token, token, 1, ncclFloat32, ncclSum, comm, stream);
      },
      options);
}

} // namespace nccl_core

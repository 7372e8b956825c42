// Collectives of NcclCoreBackend. Each one checks its arguments, then hands
// launch() its NCCL calls (nccl_calls.h).
#include <memory>

#include "backend/backend.h"
#include "backend/ops/arguments.h"
#include "backend/ops/nccl_calls.h"
#include "backend/ops/reduce_op.h"
#include "nccl/errors.h"

namespace nccl_core {

namespace {

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

std::vector<ncclRedOp_t>
ncclOps(const std::vector<std::unique_ptr<NcclReduceOp>>& ops) {
  std::vector<ncclRedOp_t> nccl;
  nccl.reserve(ops.size());
  for (const auto& op : ops) {
    nccl.push_back(op->get());
  }
  return nccl;
}

} // namespace

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::broadcast(
    std::vector<at::Tensor>& tensors,
    const c10d::BroadcastOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "broadcast";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  communicatorFor(tensor, kOp, "tensor");
  checkRank(opts.rootRank, getSize(), kOp, "root");
  checkRootTensor(opts.rootTensor, kOp);
  const int root = static_cast<int>(opts.rootRank);
  LaunchOptions options = LaunchOptions::routed();
  options.sendsData = getRank() == root;
  return runner_.launch(
      OpCall::of(c10d::OpType::BROADCAST, kOp, tensor, opts),
      {tensor},
      {},
      [&](const NcclTarget& to) { return calls::broadcast(to, tensor, root); },
      options);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "allreduce";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  Communicator& comm = communicatorFor(tensor, kOp, "tensor");
  bufferOf(tensor, kOp); // dtype check before any NCCL call
  const NcclReduceOp op(opts.reduceOp, tensor, comm, kOp);
  const LaunchOptions options =
      LaunchOptions::reducing(opts.reduceOp, op.isBuiltin());
  return runner_.launch(
      OpCall::of(c10d::OpType::ALLREDUCE, kOp, tensor, opts),
      {tensor},
      withFactor({}, op),
      [&](const NcclTarget& to) {
        return calls::allReduce(to, tensor, op.get());
      },
      options);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "allreduce_coalesced";
  NCCL_CORE_CHECK_ARG(!tensors.empty(), kOp, "expected at least one tensor");
  std::vector<std::unique_ptr<NcclReduceOp>> ops;
  std::vector<at::Tensor> factors;
  for (const auto& tensor : tensors) {
    Communicator& comm = communicatorFor(tensor, kOp, "tensor");
    NCCL_CORE_CHECK_ARG(
        tensor.device() == tensors.front().device(),
        kOp,
        "all tensors must be on one device");
    bufferOf(tensor, kOp);
    ops.push_back(
        std::make_unique<NcclReduceOp>(opts.reduceOp, tensor, comm, kOp));
    factors = withFactor(std::move(factors), *ops.back());
  }
  const std::vector<ncclRedOp_t> nccl = ncclOps(ops);
  return runner_.launch(
      OpCall::of(c10d::OpType::ALLREDUCE_COALESCED, kOp, tensors.front(), opts),
      tensors,
      factors,
      [&](const NcclTarget& to) {
        return calls::allReduceCoalesced(to, tensors, nccl);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::reduce(
    std::vector<at::Tensor>& tensors,
    const c10d::ReduceOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "reduce";
  const at::Tensor& tensor = singleTensor(tensors, kOp, "tensor");
  Communicator& comm = communicatorFor(tensor, kOp, "tensor");
  checkRank(opts.rootRank, getSize(), kOp, "root");
  checkRootTensor(opts.rootTensor, kOp);
  bufferOf(tensor, kOp);
  const NcclReduceOp op(opts.reduceOp, tensor, comm, kOp);
  const int root = static_cast<int>(opts.rootRank);
  return runner_.launch(
      OpCall::of(c10d::OpType::REDUCE, kOp, tensor, opts),
      {tensor},
      withFactor({}, op),
      [&](const NcclTarget& to) {
        return calls::reduce(to, tensor, op.get(), root);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "allgather";
  const at::Tensor& input = singleTensor(inputs, kOp, "input");
  communicatorFor(input, kOp, "input");
  NCCL_CORE_CHECK_ARG(
      outputs.size() == 1,
      kOp,
      "expected one output list, got ",
      outputs.size());
  std::vector<at::Tensor>& list = outputs.front();
  checkPerRankList(list, getSize(), input, kOp, "output list");
  checkNumel(list[getRank()], input.numel(), kOp, "this rank's output");
  return runner_.launch(
      OpCall::of(c10d::OpType::ALLGATHER, kOp, input, opts),
      list,
      {input},
      [&](const NcclTarget& to) {
        return calls::allGatherList(to, list, input);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::_allgather_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "allgather_into_tensor";
  const Communicator& comm = communicatorFor(input, kOp, "input");
  checkOutput(output, input, deviceOf(comm), kOp);
  checkNumel(output, input.numel() * getSize(), kOp, "output");
  return runner_.launch(
      OpCall::of(c10d::OpType::_ALLGATHER_BASE, kOp, input, opts),
      {output},
      {input},
      [&](const NcclTarget& to) { return calls::allGather(to, output, input); },
      LaunchOptions::gathering());
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
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
    const c10::DeviceIndex device =
        deviceOf(communicatorFor(inputs[i], kOp, "input"));
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
  return runner_.launch(
      OpCall::of(c10d::OpType::ALLGATHER_COALESCED, kOp, inputs.front(), opts),
      outputs,
      inputs,
      [&](const NcclTarget& to) {
        return calls::allGatherCoalesced(to, outputLists, inputs);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "allgather_into_tensor_coalesced";
  checkPaired(outputs, inputs, kOp);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::DeviceIndex device =
        deviceOf(communicatorFor(inputs[i], kOp, "input"));
    checkOutput(outputs[i], inputs[i], device, kOp);
    checkNumel(outputs[i], inputs[i].numel() * getSize(), kOp, "output");
  }
  return runner_.launch(
      OpCall::of(c10d::OpType::COALESCED, kOp, inputs.front(), opts),
      outputs,
      inputs,
      [&](const NcclTarget& to) {
        return calls::allGatherIntoTensors(to, outputs, inputs);
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "reduce_scatter";
  const at::Tensor& output = singleTensor(outputs, kOp, "output");
  Communicator& comm = communicatorFor(output, kOp, "output");
  NCCL_CORE_CHECK_ARG(
      inputs.size() == 1, kOp, "expected one input list, got ", inputs.size());
  std::vector<at::Tensor>& list = inputs.front();
  checkPerRankList(list, getSize(), output, kOp, "input list");
  checkNumel(list[getRank()], output.numel(), kOp, "this rank's input");
  bufferOf(output, kOp);
  const NcclReduceOp op(opts.reduceOp, output, comm, kOp);
  return runner_.launch(
      OpCall::of(c10d::OpType::REDUCE_SCATTER, kOp, output, opts),
      {output},
      withFactor(list, op),
      [&](const NcclTarget& to) {
        return calls::reduceScatterList(to, output, list, op.get());
      });
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "reduce_scatter_tensor";
  Communicator& comm = communicatorFor(input, kOp, "input");
  checkOutput(output, input, deviceOf(comm), kOp);
  checkNumel(input, output.numel() * getSize(), kOp, "input");
  bufferOf(output, kOp);
  const NcclReduceOp op(opts.reduceOp, output, comm, kOp);
  const LaunchOptions options =
      LaunchOptions::reducing(opts.reduceOp, op.isBuiltin());
  return runner_.launch(
      OpCall::of(c10d::OpType::_REDUCE_SCATTER_BASE, kOp, input, opts),
      {output},
      withFactor({input}, op),
      [&](const NcclTarget& to) {
        return calls::reduceScatter(to, output, input, op.get());
      },
      options);
}

c10::intrusive_ptr<c10d::Work> NcclCoreBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
  constexpr const char* kOp = "reduce_scatter_tensor_coalesced";
  checkPaired(outputs, inputs, kOp);
  std::vector<std::unique_ptr<NcclReduceOp>> ops;
  std::vector<at::Tensor> stash = inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Communicator& comm = communicatorFor(inputs[i], kOp, "input");
    checkOutput(outputs[i], inputs[i], deviceOf(comm), kOp);
    checkNumel(inputs[i], outputs[i].numel() * getSize(), kOp, "input");
    bufferOf(outputs[i], kOp); // dtype check before any NCCL call
    ops.push_back(
        std::make_unique<NcclReduceOp>(opts.reduceOp, outputs[i], comm, kOp));
    stash = withFactor(std::move(stash), *ops.back());
  }
  const std::vector<ncclRedOp_t> nccl = ncclOps(ops);
  return runner_.launch(
      OpCall::of(c10d::OpType::COALESCED, kOp, inputs.front(), opts),
      outputs,
      stash,
      [&](const NcclTarget& to) {
        return calls::reduceScatterIntoTensors(to, outputs, inputs, nccl);
      });
}

c10::intrusive_ptr<c10d::Work>
NcclCoreBackend::barrier(const c10d::BarrierOptions& opts) {
  const EndCoalescingOnError endOnError(runner_);
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
  // wait() on a barrier blocks the host until every rank has arrived.
  return runner_.launch(
      OpCall{c10d::OpType::BARRIER, "barrier", device, true, opts.timeout},
      {},
      {barrierToken_},
      [&](const NcclTarget& to) {
        return calls::allReduce(to, barrierToken_, ncclSum);
      },
      options);
}

} // namespace nccl_core

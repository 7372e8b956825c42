// torch_nccl_core._testing.enqueue_op: an op's NCCL calls (backend/ops/
// nccl_calls.h) made on a communicator of the fake NCCL, which records what
// NCCL was asked (FakeNccl.record), with CPU tensors standing for the op's.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/ops/arguments.h"
#include "backend/ops/nccl_calls.h"
#include "testing/bindings.h"

namespace py = pybind11;

namespace nccl_core {

namespace {

// An op's tensors and settings, as c10d hands them to the backend.
struct OpArgs {
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> inputs;
  std::vector<std::vector<at::Tensor>> lists; // allgather_coalesced's
  int root;
  int peer;
  ncclRedOp_t op;
  std::vector<int64_t> outputSplits;
  std::vector<int64_t> inputSplits;
};

using OpCalls = std::function<ncclResult_t(const NcclTarget&, const OpArgs&)>;

const std::unordered_map<std::string, OpCalls>& opCalls() {
  using T = const NcclTarget&;
  using A = const OpArgs&;
  const auto ops = [](A a) {
    return std::vector<ncclRedOp_t>(a.inputs.size(), a.op);
  };
  static const std::unordered_map<std::string, OpCalls> table{
      {"broadcast",
       [](T to, A a) { return calls::broadcast(to, a.inputs[0], a.root); }},
      {"allreduce",
       [](T to, A a) { return calls::allReduce(to, a.inputs[0], a.op); }},
      {"allreduce_coalesced",
       [ops](T to, A a) {
         return calls::allReduceCoalesced(to, a.inputs, ops(a));
       }},
      {"reduce",
       [](T to, A a) { return calls::reduce(to, a.inputs[0], a.op, a.root); }},
      {"allgather",
       [](T to, A a) {
         return calls::allGatherList(to, a.outputs, a.inputs[0]);
       }},
      {"allgather_into_tensor",
       [](T to, A a) {
         return calls::allGather(to, a.outputs[0], a.inputs[0]);
       }},
      {"allgather_coalesced",
       [](T to, A a) {
         return calls::allGatherCoalesced(to, a.lists, a.inputs);
       }},
      {"allgather_into_tensor_coalesced",
       [](T to, A a) {
         return calls::allGatherIntoTensors(to, a.outputs, a.inputs);
       }},
      {"reduce_scatter",
       [](T to, A a) {
         return calls::reduceScatterList(to, a.outputs[0], a.inputs, a.op);
       }},
      {"reduce_scatter_tensor",
       [](T to, A a) {
         return calls::reduceScatter(to, a.outputs[0], a.inputs[0], a.op);
       }},
      {"reduce_scatter_tensor_coalesced",
       [ops](T to, A a) {
         return calls::reduceScatterIntoTensors(
             to, a.outputs, a.inputs, ops(a));
       }},
      {"gather",
       [](T to, A a) {
         return calls::exchangeWithRoot(
             to, a.outputs, a.inputs[0], a.root, /*toRoot=*/true);
       }},
      {"scatter",
       [](T to, A a) {
         return calls::exchangeWithRoot(
             to, a.inputs, a.outputs[0], a.root, /*toRoot=*/false);
       }},
      {"alltoall_base",
       [](T to, A a) {
         const int size = to.comm.size();
         return calls::allToAll(
             to,
             a.outputs[0],
             a.inputs[0],
             allToAllCounts(a.inputs[0], a.inputSplits, size, "input"),
             allToAllCounts(a.outputs[0], a.outputSplits, size, "output"));
       }},
      {"alltoall",
       [](T to, A a) { return calls::allToAllList(to, a.outputs, a.inputs); }},
      {"send", [](T to, A a) { return calls::send(to, a.inputs[0], a.peer); }},
      {"recv", [](T to, A a) { return calls::recv(to, a.outputs[0], a.peer); }},
  };
  return table;
}

} // namespace

void bindNcclCalls(py::module_& testing) {
  testing.def(
      "enqueue_op",
      [](Communicator& comm,
         const std::string& op,
         OpArgs args,
         uintptr_t stream) {
        const auto calls = opCalls().find(op);
        TORCH_CHECK_VALUE(calls != opCalls().end(), "unknown op '", op, "'");
        const Communicator::Use use = comm.use();
        const NcclTarget to{
            comm, use.handle(), reinterpret_cast<cudaStream_t>(stream)};
        comm.check(calls->second(to, args), op.c_str());
      },
      py::arg("comm"),
      py::arg("op"),
      py::arg("args"),
      py::arg("stream") = 0,
      "The NCCL calls of c10d op `op` (its backend name) for `args`, on "
      "`comm`, a communicator of the fake.");
  py::class_<OpArgs>(
      testing, "OpArgs", "An op's tensors and settings, as c10d passes them.")
      .def(
          py::init([](std::vector<at::Tensor> outputs,
                      std::vector<at::Tensor> inputs,
                      std::vector<std::vector<at::Tensor>> lists,
                      int root,
                      int peer,
                      int op,
                      std::vector<int64_t> outputSplits,
                      std::vector<int64_t> inputSplits) {
            return OpArgs{
                std::move(outputs),
                std::move(inputs),
                std::move(lists),
                root,
                peer,
                static_cast<ncclRedOp_t>(op),
                std::move(outputSplits),
                std::move(inputSplits)};
          }),
          py::arg("outputs") = std::vector<at::Tensor>{},
          py::arg("inputs") = std::vector<at::Tensor>{},
          py::arg("lists") = std::vector<std::vector<at::Tensor>>{},
          py::arg("root") = 0,
          py::arg("peer") = 0,
          py::arg("op") = 0,
          py::arg("output_splits") = std::vector<int64_t>{},
          py::arg("input_splits") = std::vector<int64_t>{});
}

} // namespace nccl_core

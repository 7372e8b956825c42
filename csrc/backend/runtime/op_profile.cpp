#include "backend/runtime/op_profile.h"

#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

#include <string_view>
#include <tuple>

#include "backend/runtime/torch_op_names.h"

namespace nccl_core {

namespace {

int64_t elements(const std::vector<at::Tensor>& tensors) {
  int64_t count = 0;
  for (const at::Tensor& tensor : tensors) {
    count += tensor.numel();
  }
  return count;
}

// What ProcessGroupNCCL's Work records as the range's inputs: the op's input
// tensors (an in-place op's tensor), complex ones as the real views NCCL
// moves, so that the profiler shows the shapes torch's tests expect (a
// conjugated one as it is: it has no real view, and recording must not
// raise on one rank only).
std::vector<c10::IValue> recordedInputs(
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& outputs) {
  const std::vector<at::Tensor>& tensors = inputs.empty() ? outputs : inputs;
  std::vector<c10::IValue> values;
  values.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    values.emplace_back(
        tensor.is_complex() && !tensor.is_conj() ? at::view_as_real(tensor)
                                                 : tensor);
  }
  return values;
}

} // namespace

OpProfile::OpProfile(
    const OpInfo& info,
    const std::string& group,
    int rank,
    int size,
    int peer,
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& outputs) {
  if (C10_LIKELY(!range_.isActive())) {
    return;
  }
  // torch's record_param_comms event, as an instant at the op's launch. The
  // global rank layout of a group is not known here: start 0, stride 1, as
  // ProcessGroupNCCL reports for a group without global_ranks_in_group.
  const bool pointToPoint =
      info.type == c10d::OpType::SEND || info.type == c10d::OpType::RECV;
  const std::vector<at::Tensor>& sent = sentTensors(info.type, outputs, inputs);
  const std::vector<at::Tensor>& typed = !sent.empty() ? sent : outputs;
  RECORD_PARAM_COMMS_DATA(
      std::make_tuple(static_cast<int64_t>(info.seq), pointToPoint),
      std::make_tuple(group, group),
      sent,
      outputs,
      rank,
      info.name,
      elements(sent),
      elements(outputs),
      !typed.empty() ? typed.front().scalar_type() : at::kByte,
      std::vector<int64_t>(),
      std::vector<int64_t>(),
      0,
      1,
      size);
  title_ = torchOpName("nccl_core:", info.name, rank, peer);
  // c10d::Work's ranges are async events (ProcessGroupNCCL's end as soon as
  // the op is enqueued, through its already complete future).
  range_._setAsync();
  const std::vector<c10::IValue> values = recordedInputs(inputs, outputs);
  range_.before(
      std::string_view(title_), &values, static_cast<int64_t>(info.seq));
}

} // namespace nccl_core

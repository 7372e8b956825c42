#include "backend/runtime/torch_op_names.h"

#include <c10/util/StringUtil.h>

#include <map>

namespace nccl_core {

std::string torchOpName(
    std::string_view prefix,
    std::string_view name,
    int rank,
    int peer) {
  static const std::map<std::string_view, const char*> kNames = {
      {"allreduce", "all_reduce"},
      {"allreduce_coalesced", "allreduce_coalesced"},
      {"broadcast", "broadcast"},
      {"reduce", "reduce"},
      {"allgather", "all_gather"},
      {"allgather_into_tensor", "_all_gather_base"},
      {"allgather_coalesced", "ALLGATHER_coalesced"},
      {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
      {"gather", "gather"},
      {"scatter", "scatter"},
      {"reduce_scatter", "reduce_scatter"},
      {"reduce_scatter_tensor", "_reduce_scatter_base"},
      {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced"},
      {"alltoall_base", "all_to_all_single"},
      {"alltoall", "all_to_all"},
      {"barrier", "barrier"},
  };
  if (name == "send") {
    return c10::str(prefix, "send ", rank, "->", peer);
  }
  if (name == "recv") {
    return c10::str(prefix, "recv ", rank, "<-", peer);
  }
  const auto known = kNames.find(name);
  return known != kNames.end() ? c10::str(prefix, known->second)
                               : c10::str(prefix, name);
}

} // namespace nccl_core

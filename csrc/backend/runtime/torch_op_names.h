// torch's names of nccl_core's ops, as ProcessGroupNCCL gives them to its
// profiler ranges ("nccl:all_reduce") and its flight recorder entries, where
// torch's tools match them (its DDP profiling tests, the flight recorder's
// analyzer: flight_recorder/components/types.py).
#pragma once

#include <string>
#include <string_view>

namespace nccl_core {

// `prefix` and torch's name of the op nccl_core calls `name` ("allreduce" ->
// "all_reduce"; a send or recv names `rank` and `peer`: "send 0->1",
// "recv 1<-0").
std::string
torchOpName(std::string_view prefix, std::string_view name, int rank, int peer);

} // namespace nccl_core

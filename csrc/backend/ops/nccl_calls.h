// The NCCL calls of each c10d op, apart from its argument checks: what NCCL
// is asked (buffers, counts, dtypes, reduce ops, roots, peers, NCCL groups)
// for the tensors the checks let through. The ops hand them to launch();
// CPU tests run them against the fake NCCL, which records the arguments
// (tests/cpu/test_nccl_calls.py).
#pragma once

#include <ATen/ATen.h>
#include <nccl.h>

#include <vector>

#include "nccl/communicator.h"

namespace nccl_core {

// Where an op's NCCL calls go: the communicator the op was routed to, its
// handle (held for the op by the op runner) and the stream, which the runner
// makes the current one while the calls are made. Every NCCL result goes
// through check(): the communicator's, which waits out a nonblocking
// ncclInProgress and names an abort as the cause.
struct NcclTarget {
  Communicator& comm;
  ncclComm_t handle;
  cudaStream_t stream;

  const NcclApi& api() const {
    return comm.api();
  }
  void check(
      ncclResult_t result,
      const char* call,
      const char* file = __builtin_FILE(),
      int line = __builtin_LINE()) const {
    comm.check(result, call, file, line);
  }
};

namespace calls {

// Point-to-point ops move bytes: any dtype works.
ncclResult_t send(const NcclTarget& to, const at::Tensor& tensor, int peer);
ncclResult_t recv(const NcclTarget& to, const at::Tensor& tensor, int peer);

ncclResult_t
broadcast(const NcclTarget& to, const at::Tensor& tensor, int root);
ncclResult_t
allReduce(const NcclTarget& to, const at::Tensor& tensor, ncclRedOp_t op);
// One NCCL group: the tensors[i] reduced by ops[i].
ncclResult_t allReduceCoalesced(
    const NcclTarget& to,
    const std::vector<at::Tensor>& tensors,
    const std::vector<ncclRedOp_t>& ops);
ncclResult_t reduce(
    const NcclTarget& to,
    const at::Tensor& tensor,
    ncclRedOp_t op,
    int root);
// all_gather into a list: one broadcast per rank, in one group, so that the
// parts may differ in size. This rank's part comes from `input`.
ncclResult_t allGatherList(
    const NcclTarget& to,
    const std::vector<at::Tensor>& list,
    const at::Tensor& input);
ncclResult_t allGather(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input);
// allgather_coalesced: rank r's inputs land in lists[r], one broadcast each.
ncclResult_t allGatherCoalesced(
    const NcclTarget& to,
    const std::vector<std::vector<at::Tensor>>& lists,
    const std::vector<at::Tensor>& inputs);
ncclResult_t allGatherIntoTensors(
    const NcclTarget& to,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs);
// reduce_scatter from a list: one reduce per rank, in one group.
ncclResult_t reduceScatterList(
    const NcclTarget& to,
    const at::Tensor& output,
    const std::vector<at::Tensor>& list,
    ncclRedOp_t op);
ncclResult_t reduceScatter(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input,
    ncclRedOp_t op);
ncclResult_t reduceScatterIntoTensors(
    const NcclTarget& to,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    const std::vector<ncclRedOp_t>& ops);
// gather (`toRoot`) or scatter: the root moves list[r] from or to rank r, by
// a copy on the stream for itself; every other rank sends or receives `mine`.
ncclResult_t exchangeWithRoot(
    const NcclTarget& to,
    const std::vector<at::Tensor>& list,
    const at::Tensor& mine,
    int root,
    bool toRoot);
// all_to_all_single: counts[r] elements of each side to and from rank r,
// in order along the tensors.
ncclResult_t allToAll(
    const NcclTarget& to,
    const at::Tensor& output,
    const at::Tensor& input,
    const std::vector<int64_t>& sendCounts,
    const std::vector<int64_t>& recvCounts);
ncclResult_t allToAllList(
    const NcclTarget& to,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs);

} // namespace calls
} // namespace nccl_core

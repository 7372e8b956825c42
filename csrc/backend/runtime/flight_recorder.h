// The last N ops of every nccl_core group of this process, dumped in the
// format of torch's flight recorder (c10d::FlightRecorder, dump version 2.10)
// so that torch's analyzer (torch.distributed.flight_recorder.fr_trace) reads
// it: on a timeout or an NCCL error when TORCH_NCCL_DUMP_ON_TIMEOUT (or
// TORCH_FR_DUMP_ON_TIMEOUT) is set, and on demand
// (torch_nccl_core.dump_flight_recorder).
//
// torch's own recorder cannot be fed from outside libtorch before torch 2.15:
// its symbols are hidden and its template definitions need nlohmann/json,
// which the wheel does not ship. From torch 2.15 on, torch's
// FlightRecorderHook records every group, nccl_core's included, and this
// recorder stays off (docs/compatibility.md).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace nccl_core {

// What the recorder notes of an op besides its tensors.
struct TracedOp {
  const char* name; // nccl_core's name of the op ("allreduce")
  uint64_t seq;     // the group's number of the op
  bool sync;        // runs on the caller's stream and has no event of its own
  std::chrono::milliseconds timeout;
  int rank;      // this process's rank in the group
  int peer = -1; // send and recv: the other rank of the group
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The process's recorder: TORCH_FR_BUFFER_SIZE (or
  // TORCH_NCCL_TRACE_BUFFER_SIZE) entries, 2000 by default as torch's; none
  // from torch 2.15. Never destroyed: ops may be recorded during exit.
  static FlightRecorder& process();

  bool enabled() const {
    return capacity_ > 0;
  }

  // A new group (a group re-made under the same name is a new one) and its
  // members (global ranks); its id for the calls below.
  size_t addGroup(const std::string& name, std::vector<int64_t> ranks);

  // Notes `op` of `group` (described as `desc`, which torch sets after the
  // group is made) as scheduled; its id, for complete().
  std::optional<size_t> record(
      size_t group,
      const std::string& desc,
      const TracedOp& op,
      const std::vector<at::Tensor>& inputs,
      const std::vector<at::Tensor>& outputs);
  // The op `id` finished successfully.
  void complete(size_t id);
  // Every synchronous op of `group` numbered below `seq` finished.
  void syncOpsFinishedBefore(size_t group, uint64_t seq);

  // torch's dump: a pickled dict of entries, pg_config and pg_status.
  std::string dump(bool onlyActive);

  // Writes dump() through torch's DebugInfoWriter
  // (TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>) if TORCH_NCCL_DUMP_ON_TIMEOUT or
  // TORCH_FR_DUMP_ON_TIMEOUT is set, one group at a time. Never throws.
  void dumpOnFailure(int globalRank) noexcept;

 private:
  struct Entry {
    size_t id;
    size_t group;
    uint64_t collectiveSeq;
    uint64_t p2pSeq;
    uint64_t opId;
    std::string profilingName;
    uint64_t seq;
    bool sync;
    bool p2p;
    int64_t createdNs;
    std::optional<int64_t> completedNs;
    int64_t timeoutMs;
    std::vector<std::vector<int64_t>> inputSizes;
    std::vector<std::string> inputDtypes;
    std::vector<std::vector<int64_t>> outputSizes;
    std::vector<std::string> outputDtypes;
  };
  struct Group {
    std::string name;
    std::string desc;
    std::vector<int64_t> ranks;
    uint64_t collectives = 0;
    uint64_t p2p = 0;
    uint64_t ops = 0;
    uint64_t syncFinishedBefore = 0;
  };

  bool completedLocked(const Entry& entry) const;
  // One entry as torch's dump writes it (its keys, c10d's FlightRecorder).
  c10::Dict<c10::IValue, c10::IValue>
  entryDict(const Entry& entry, bool completed) const;

  const size_t capacity_;
  std::mutex mutex_;
  std::vector<Entry> entries_; // a ring once full
  size_t next_ = 0;            // the id of the next entry
  std::vector<Group> groups_;  // by id
};

} // namespace nccl_core

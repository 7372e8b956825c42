#include "backend/runtime/flight_recorder.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/Logging.h>
#include <c10/util/env.h>
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "backend/runtime/torch_op_names.h"
#include "nccl/version.h"

namespace nccl_core {

namespace {
// Where torch's FlightRecorderHook records every group itself.
constexpr bool kTorchRecords =
    TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 15;
constexpr size_t kDefaultCapacity = 2000; // torch's default

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Generic lists only: the pickler tags typed ones for TorchScript, which
// Python's pickle cannot read.
c10::List<c10::IValue> sizesList(const std::vector<std::vector<int64_t>>& all) {
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (const auto& sizes : all) {
    c10::List<c10::IValue> dims(c10::AnyType::get());
    for (int64_t dim : sizes) {
      dims.push_back(dim);
    }
    list.push_back(c10::IValue(dims));
  }
  return list;
}

c10::List<c10::IValue> stringList(const std::vector<std::string>& all) {
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (const auto& value : all) {
    list.push_back(c10::IValue(value));
  }
  return list;
}

c10::Dict<c10::IValue, c10::IValue> newDict() {
  return c10::Dict<c10::IValue, c10::IValue>(
      c10::AnyType::get(), c10::AnyType::get());
}

void noteTensors(
    const std::vector<at::Tensor>& tensors,
    std::vector<std::vector<int64_t>>& sizes,
    std::vector<std::string>& dtypes) {
  for (const at::Tensor& tensor : tensors) {
    sizes.emplace_back(tensor.sizes().begin(), tensor.sizes().end());
    dtypes.emplace_back(c10::toString(tensor.scalar_type()));
  }
}

size_t capacityFromEnv() {
  if (kTorchRecords) {
    return 0;
  }
  for (const char* name :
       {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}) {
    if (const auto value = c10::utils::get_env(name)) {
      return static_cast<size_t>(std::max(0L, std::atol(value->c_str())));
    }
  }
  return kDefaultCapacity;
}
} // namespace

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) {
  entries_.reserve(std::min<size_t>(capacity_, 64));
}

FlightRecorder& FlightRecorder::process() {
  static auto* recorder = new FlightRecorder(capacityFromEnv());
  return *recorder;
}

size_t
FlightRecorder::addGroup(const std::string& name, std::vector<int64_t> ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(Group{name, "", std::move(ranks)});
  return groups_.size() - 1;
}

std::optional<size_t> FlightRecorder::record(
    size_t group,
    const std::string& desc,
    const TracedOp& op,
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& outputs) {
  if (!enabled()) {
    return std::nullopt;
  }
  const bool p2p = op.peer >= 0;
  Entry entry{};
  entry.group = group;
  entry.seq = op.seq;
  entry.sync = op.sync;
  entry.p2p = p2p;
  entry.profilingName = torchOpName("nccl:", op.name, op.rank, op.peer);
  entry.createdNs = nowNs();
  entry.timeoutMs = op.timeout.count();
  noteTensors(inputs, entry.inputSizes, entry.inputDtypes);
  noteTensors(outputs, entry.outputSizes, entry.outputDtypes);
  std::lock_guard<std::mutex> lock(mutex_);
  Group& traced = groups_.at(group);
  if (traced.desc != desc) {
    traced.desc = desc;
  }
  // torch numbers collectives and point-to-point ops apart, from 1.
  entry.collectiveSeq = p2p ? traced.collectives : ++traced.collectives;
  entry.p2pSeq = p2p ? ++traced.p2p : traced.p2p;
  entry.opId = ++traced.ops;
  entry.id = next_++;
  if (entries_.size() < capacity_) {
    entries_.push_back(std::move(entry));
  } else {
    entries_[entry.id % capacity_] = std::move(entry);
  }
  return next_ - 1;
}

void FlightRecorder::complete(size_t id) {
  if (!enabled()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (id + capacity_ < next_) {
    return; // overwritten since
  }
  entries_[id % capacity_].completedNs = nowNs();
}

void FlightRecorder::syncOpsFinishedBefore(size_t group, uint64_t seq) {
  if (!enabled()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Group& traced = groups_.at(group);
  traced.syncFinishedBefore = std::max(traced.syncFinishedBefore, seq);
}

bool FlightRecorder::completedLocked(const Entry& entry) const {
  return entry.completedNs.has_value() ||
         (entry.sync && entry.seq < groups_.at(entry.group).syncFinishedBefore);
}

c10::Dict<c10::IValue, c10::IValue>
FlightRecorder::entryDict(const Entry& e, bool completed) const {
  const Group& group = groups_[e.group];
  auto dict = newDict();
  dict.insert(c10d::record_id_key_str, static_cast<int64_t>(e.id));
  dict.insert(c10d::pg_id_key_str, static_cast<int64_t>(e.group));
  dict.insert(
      c10d::pg_name_key_str,
      c10::ivalue::Tuple::create(group.name, group.desc));
  dict.insert(
      c10d::collective_seq_id_key_str, static_cast<int64_t>(e.collectiveSeq));
  dict.insert(c10d::p2p_seq_id_key_str, static_cast<int64_t>(e.p2pSeq));
  dict.insert(c10d::op_id_key_str, static_cast<int64_t>(e.opId));
  dict.insert(c10d::profiling_name_key_str, e.profilingName);
  dict.insert(c10d::time_created_key_str, e.createdNs);
  dict.insert(c10d::input_sizes_key_str, sizesList(e.inputSizes));
  dict.insert(c10d::input_dtypes_key_str, stringList(e.inputDtypes));
  dict.insert(c10d::output_sizes_key_str, sizesList(e.outputSizes));
  dict.insert(c10d::output_dtypes_key_str, stringList(e.outputDtypes));
  dict.insert(
      c10d::state_key_str,
      completed ? c10d::completed_state_str : c10d::scheduled_state_str);
  dict.insert(c10d::time_discovered_started_key_str, c10::IValue());
  dict.insert(
      c10d::time_discovered_completed_key_str,
      e.completedNs ? c10::IValue(*e.completedNs) : c10::IValue());
  dict.insert(c10d::retired_key_str, completed);
  dict.insert(c10d::timeout_key_str, e.timeoutMs);
  dict.insert(c10d::is_p2p_key_str, e.p2p);
  dict.insert(
      c10d::frames_key_str, c10::List<c10::IValue>(c10::AnyType::get()));
  return dict;
}

std::string FlightRecorder::dump(bool onlyActive) {
  auto entries = c10::List<c10::IValue>(c10::AnyType::get());
  auto config = newDict();
  auto status = newDict();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> lastCompleted(groups_.size(), -1);
  // Oldest first: the ring's next slot holds the oldest entry once full.
  const size_t count = entries_.size();
  const size_t first = count < capacity_ || count == 0 ? 0 : next_ % capacity_;
  for (size_t i = 0; i < count; ++i) {
    const Entry& e = entries_[(first + i) % count];
    const bool completed = completedLocked(e);
    if (completed && !e.p2p) {
      int64_t& last = lastCompleted[e.group];
      last = std::max(last, static_cast<int64_t>(e.collectiveSeq));
    }
    if (onlyActive && completed) {
      continue;
    }
    entries.push_back(c10::IValue(entryDict(e, completed)));
  }
  // A group re-made under the same name describes it from then on.
  for (size_t id = 0; id < groups_.size(); ++id) {
    const Group& group = groups_[id];
    auto described = newDict();
    described.insert("name", group.name);
    described.insert("desc", group.desc);
    described.insert("ranks", c10::str(c10::ArrayRef<int64_t>(group.ranks)));
    config.insert_or_assign(group.name, described);
    auto state = newDict();
    state.insert(
        "last_enqueued_collective", static_cast<int64_t>(group.collectives));
    state.insert("last_started_collective", int64_t{-1});
    state.insert("last_completed_collective", lastCompleted[id]);
    status.insert_or_assign(group.name, state);
  }
  auto result = newDict();
  result.insert(c10d::version_key_str, c10d::version_val_str);
  const NcclVersion& nccl = runtimeVersion();
  result.insert(
      c10d::comm_lib_version_key_str,
      c10::str(nccl.major, ".", nccl.minor, ".", nccl.patch));
  result.insert(c10d::pg_config_key_str, config);
  result.insert(c10d::pg_status_key_str, status);
  result.insert(c10d::entries_key_str, entries);
  return c10d::pickle_str(result); // torch's own dump format
}

void FlightRecorder::dumpOnFailure(int globalRank) noexcept {
  if (!enabled() ||
      !(c10::utils::check_env("TORCH_NCCL_DUMP_ON_TIMEOUT") == true ||
        c10::utils::check_env("TORCH_FR_DUMP_ON_TIMEOUT") == true)) {
    return;
  }
  // Groups failing together dump from their watchdogs at once: torch's
  // writer is made on first use without a lock, and they share its file.
  static std::mutex dumping;
  const std::lock_guard<std::mutex> lock(dumping);
  try {
    c10d::DebugInfoWriter& writer =
        c10d::DebugInfoWriter::getWriter(globalRank);
    writer.write(dump(false));
    LOG(INFO) << "[nccl_core] flight recorder dumped to "
              << writer.getWriterTarget();
  } catch (const std::exception& e) {
    LOG(ERROR) << "[nccl_core] flight recorder dump failed: " << e.what();
  }
}

} // namespace nccl_core

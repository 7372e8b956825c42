// torch_nccl_core._C._testing: the backend's host-side logic driven by CPU
// tests with fakes in place of the GPU, so that CI (which has none) runs it.
#include "python/testing_bindings.h"

#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>

#include "backend/sync_ops.h"

namespace py = pybind11;

namespace nccl_core {

namespace {

// Events of a GPU that finishes ops in order: an event recorded after op N is
// complete once the test has completed every op up to N. The op's number
// travels in place of the stream handle.
struct FakeSpanEvents {
  struct Recorded {
    uint64_t seq = 0;
  };
  using Event = std::shared_ptr<Recorded>;
  std::shared_ptr<const uint64_t> completedThrough;

  Event acquire() {
    return std::make_shared<Recorded>();
  }
  static void record(const Event& event, cudaStream_t op) {
    event->seq = reinterpret_cast<uint64_t>(op);
  }
  bool finished(const Event& event) const {
    return event->seq <= *completedThrough;
  }
};

// A SyncOpTimeline over FakeSpanEvents with times in milliseconds.
class FakeTimeline {
 public:
  explicit FakeTimeline(double spanMs)
      : completed_(std::make_shared<uint64_t>(0)),
        timeline_(FakeSpanEvents{completed_}, toDuration(spanMs)) {}

  void note(uint64_t seq, double nowMs) {
    timeline_.note(
        reinterpret_cast<cudaStream_t>(seq), "op", seq, toTime(nowMs));
  }
  void completeThrough(uint64_t seq) {
    *completed_ = seq;
  }
  // (first op of the oldest unfinished span, lower bound of its age in ms)
  std::optional<std::pair<uint64_t, double>> oldest(double nowMs) {
    const auto found = timeline_.oldestUnfinished(toTime(nowMs));
    if (!found) {
      return std::nullopt;
    }
    return std::make_pair(
        found->seq,
        std::chrono::duration<double, std::milli>(found->age).count());
  }
  size_t spanCount() {
    return timeline_.spanCount();
  }

 private:
  using Clock = std::chrono::steady_clock;
  static Clock::duration toDuration(double ms) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(ms));
  }
  static Clock::time_point toTime(double ms) {
    return Clock::time_point(toDuration(ms));
  }

  std::shared_ptr<uint64_t> completed_;
  BasicSyncOpTimeline<FakeSpanEvents> timeline_;
};

} // namespace

void bindTesting(py::module_& m) {
  py::module_ testing = m.def_submodule(
      "_testing", "Host-side logic with fakes in place of the GPU (tests).");
  py::class_<FakeTimeline>(
      testing,
      "SyncOpTimeline",
      "The watchdog's synchronous-op timeline over fake events: ops finish in "
      "order when complete_through says so; times are in ms.")
      .def(py::init<double>(), py::arg("span_ms"))
      .def("note", &FakeTimeline::note, py::arg("seq"), py::arg("now_ms"))
      .def("complete_through", &FakeTimeline::completeThrough, py::arg("seq"))
      .def("oldest", &FakeTimeline::oldest, py::arg("now_ms"))
      .def("span_count", &FakeTimeline::spanCount);
}

} // namespace nccl_core

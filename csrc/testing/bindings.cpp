// torch_nccl_core._testing: the backend's host-side logic driven by CPU
// tests with fakes in place of the GPU, so that CI (which has none) runs it.
#include "testing/bindings.h"

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/ops/nan_check.h"
#include "backend/options.h"
#include "backend/runtime/event_pool.h"
#include "backend/runtime/failure.h"
#include "backend/runtime/flight_recorder.h"
#include "backend/runtime/hooks.h"
#include "backend/runtime/meetings.h"
#include "backend/runtime/sync_ops.h"
#include "backend/runtime/watchdog.h"
#include "backend/runtime/work.h"
#include "nccl/api.h"
#include "nccl/communicator.h"
#include "python/translate_errors.h"
#include "testing/fake_nccl.h"

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
  uint64_t finishedBefore() const {
    return timeline_.finishedBefore();
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

// A watchdog over a communicator of the fake NCCL, with its failure record.
class WatchdogUnderTest {
 public:
  WatchdogUnderTest(
      std::shared_ptr<Communicator> comm,
      c10::intrusive_ptr<c10d::Store> store,
      std::string group,
      std::string abortKey,
      std::chrono::milliseconds timeout)
      : comm_(comm),
        failure_(std::make_shared<FailureState>()),
        watchdog_(
            WatchedGroup{
                std::move(comm),
                failure_,
                std::move(store),
                std::move(group),
                std::move(abortKey),
                std::make_shared<EventPool>(0),
                hooks_,
                ephemeral_},
            timeout) {}

  std::optional<std::string> failure() const {
    return failure_->failed() ? std::optional(failure_->message())
                              : std::nullopt;
  }
  void stop() {
    watchdog_.stop();
  }
  // An all_reduce enqueued on the communicator as launch() enqueues an op: a
  // host call the watchdog times. The fake NCCL may hold it there.
  void enqueueAllReduce(uint64_t seq, std::chrono::milliseconds timeout) {
    const Watchdog::Enqueueing timed(watchdog_, "allreduce", seq, timeout);
    const Communicator::HostCall call(*comm_);
    comm_->check(
        comm_->api().allReduce(
            nullptr, nullptr, 0, ncclFloat, ncclSum, call.handle(), nullptr),
        "ncclAllReduce");
  }
  void addAbortHook(int64_t id, std::function<void()> hook) {
    hooks_->abort.add(id, std::move(hook));
  }
  void
  addEphemeralTimeout(std::chrono::milliseconds amount, uint64_t firstSeq) {
    ephemeral_->add(amount, firstSeq);
  }
  std::chrono::milliseconds ephemeralTimeout() const {
    return ephemeral_->active();
  }
  // Tracks an async Work whose op already finished (it owns no event), as
  // launch() does; returns its completion key (torch >= 2.15), else `seq`.
  uint64_t trackFinishedOp(uint64_t seq) {
    auto work = c10::make_intrusive<NcclWork>(WorkSpec{
        OpInfo{c10d::OpType::ALLREDUCE, "allreduce", seq},
        at::Device(at::kCUDA, 0),
        std::make_shared<const std::string>("g"),
        std::chrono::milliseconds(30000)});
#if NCCL_CORE_HAS_COMPLETION_HOOKS
    const uint64_t key = work->getCompletionKey();
#else
    const uint64_t key = seq;
#endif
    watchdog_.track(std::move(work));
    return key;
  }
#if NCCL_CORE_HAS_COMPLETION_HOOKS
  void addCompletionHook(
      int64_t id,
      std::function<void(uint64_t, std::optional<float>)> hook) {
    hooks_->completion.add(
        id, [hook = std::move(hook)](const c10d::CompletionHookArgs& args) {
          hook(args.completionKey, args.duration_ms);
        });
  }
#endif

 private:
  const std::shared_ptr<Communicator> comm_;
  std::shared_ptr<FailureState> failure_;
  std::shared_ptr<BackendHooks> hooks_ = std::make_shared<BackendHooks>();
  std::shared_ptr<EphemeralTimeouts> ephemeral_ =
      std::make_shared<EphemeralTimeouts>();
  Watchdog watchdog_;
};

// Long, but a list: one pybind11 definition per bound name.
// The fake itself: scripting and what it counted.
void bindFakeNcclClass(py::module_& testing) {
  using Fake = FakeNccl;
  py::class_<Fake>(
      testing,
      "FakeNccl",
      "A scripted NCCL (see fake_nccl.h), current until uninstall(): "
      "communicators of it come from create_communicator, groups of it from "
      "options it was injected into.")
      .def(
          py::init<bool, bool, bool, bool>(),
          py::arg("real_cuda") = false,
          py::arg("revoke") = true,
          py::arg("suspend") = true,
          py::arg("grow") = true)
      .def("uninstall", &Fake::uninstall)
      .def(
          "inject",
          [](const Fake& fake, NcclCoreOptions& options) {
            options.api = &fake.table();
          },
          py::arg("options"),
          py::keep_alive<2, 1>(),
          "Groups made with `options` call this fake (which `options` keeps "
          "alive); uninstall it only once they are destroyed.")
      .def("hold", &Fake::hold, py::arg("call"))
      .def("release", &Fake::release, py::arg("call"))
      .def("fail_next", &Fake::failNext, py::arg("call"), py::arg("result"))
      .def("set_async_error", &Fake::setAsyncError, py::arg("result"))
      .def("calls", &Fake::calls, py::arg("call"))
      .def("inside", &Fake::inside, py::arg("call"))
      .def_property_readonly("live", &Fake::live)
      .def_property_readonly("aborted_under_call", &Fake::abortedUnderCall)
      .def_property_readonly("used_after_free", &Fake::usedAfterFree)
      .def_property_readonly("last_shrink_flags", &Fake::lastShrinkFlags)
      .def("record", &Fake::record, py::arg("on") = true)
      .def(
          "recorded",
          [](Fake& fake) {
            py::list records;
            for (const auto& r : fake.takeRecorded()) {
              py::dict record;
              record["call"] = r.call;
              record["buffers"] = r.buffers;
              record["count"] = r.count;
              record["dtype"] = r.dtype;
              record["op"] = r.op;
              record["peer"] = r.peer;
              record["rank"] = r.rank;
              record["stream"] = r.stream;
              records.append(record);
            }
            return records;
          },
          "The calls recorded since the last look, as dicts (Record's "
          "fields).");
}

// Communicators of the fake: made, split, shrunk, grown, joined.
void bindCommunicatorMaking(py::module_& testing) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  testing.def(
      "create_communicator",
      [](int nranks,
         int rank,
         std::chrono::milliseconds timeout,
         bool blocking,
         const std::string& label) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = blocking ? 1 : 0;
        return Communicator::create(
            nranks,
            rank,
            ncclUniqueId{},
            {&FakeNccl::current().table(), 0, config, timeout, label});
      },
      py::arg("nranks"),
      py::arg("rank"),
      py::arg("timeout"),
      py::arg("blocking"),
      py::arg("label"),
      release);
  testing.def(
      "split",
      [](Communicator& comm, int color, int key) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        return comm.split(color, key, config, "group 'child'");
      },
      py::arg("comm"),
      py::arg("color"),
      py::arg("key"),
      release);
  testing.def(
      "shrink",
      [](Communicator& comm, std::vector<int> excluded, int flags) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        return comm.shrink(
            std::move(excluded), flags, config, "group 'shrunk'");
      },
      py::arg("comm"),
      py::arg("excluded"),
      py::arg("flags"),
      release);
  testing.def(
      "grow",
      [](Communicator& comm, int newSize, bool root, bool blocking) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = blocking ? 1 : 0;
        const std::optional<ncclUniqueId> id =
            root ? std::optional(comm.growId()) : std::nullopt;
        return comm.grow(newSize, id ? &*id : nullptr, config, "group 'grown'");
      },
      py::arg("comm"),
      py::arg("new_size"),
      py::arg("root"),
      py::arg("blocking") = true,
      release);
  testing.def(
      "join",
      [](int newSize, int rank, std::chrono::milliseconds timeout) {
        return Communicator::create(
            newSize,
            rank,
            ncclUniqueId{},
            {&FakeNccl::current().table(),
             0,
             NCCL_CONFIG_INITIALIZER,
             timeout,
             "group 'grown'"},
            nullptr,
            Communicator::Joining::Grow);
      },
      py::arg("new_size"),
      py::arg("rank"),
      py::arg("timeout"),
      release);
}

// meetings.h's store meetings.
void bindMeetings(py::module_& testing) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  testing.def(
      "rendezvous",
      [](const c10::intrusive_ptr<c10d::Store>& store,
         const std::string& prefix,
         int rank,
         int size,
         std::chrono::milliseconds timeout,
         const std::function<bool()>& abandon) {
        const ncclUniqueId id = rendezvous(
            {*store, prefix, timeout, "group 'g'", abandon}, rank, size, [] {
              return Communicator::uniqueId(FakeNccl::current().table());
            });
        return std::vector<uint8_t>(id.internal, id.internal + sizeof(id));
      },
      py::arg("store"),
      py::arg("prefix"),
      py::arg("rank"),
      py::arg("size"),
      py::arg("timeout"),
      py::arg("abandon") = std::function<bool()>(),
      release,
      "meetings.h's meeting of rank `rank` of `size`: the unique id's "
      "bytes.");
  testing.def(
      "meet",
      [](const c10::intrusive_ptr<c10d::Store>& store,
         const std::string& prefix,
         int rank,
         const std::vector<int>& ranks,
         int64_t count,
         std::chrono::milliseconds timeout) {
        return meet({*store, prefix, timeout, "group 'g'"}, rank, ranks, count);
      },
      py::arg("store"),
      py::arg("prefix"),
      py::arg("rank"),
      py::arg("ranks"),
      py::arg("count"),
      py::arg("timeout"),
      release,
      "meetings.h's meeting of `ranks`: its tally.");
  testing.def(
      "give_up_meeting",
      [](const c10::intrusive_ptr<c10d::Store>& store,
         const std::string& prefix) { giveUpMeeting(*store, prefix); },
      py::arg("store"),
      py::arg("prefix"),
      release);
}

// A communicator's abort, suspend / resume, flush and kernel stop.
void bindCommunicatorLife(py::module_& testing) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  testing.def(
      "abort",
      [](Communicator& comm) { comm.abort(); },
      py::arg("comm"),
      release);
  // A member function bound here takes a pointer: refuse None before it.
  const py::arg comm = py::arg("comm").none(false);
  testing.def("suspend", &Communicator::suspend, comm, release);
  testing.def("resume", &Communicator::resume, comm, release);
  testing.def(
      "memory_stats",
      [](Communicator& comm) {
        const Communicator::MemoryStats stats = comm.memoryStats();
        return py::dict(
            py::arg("suspendable") = stats.suspendable,
            py::arg("persistent") = stats.persistent,
            py::arg("total") = stats.total,
            py::arg("suspended") = stats.suspended);
      },
      py::arg("comm"));
  testing.def(
      "flush",
      [](Communicator& comm) { return comm.flush(); },
      py::arg("comm"),
      release);
  testing.def(
      "stop_kernels",
      [](Communicator& comm) { return comm.stopKernels(); },
      py::arg("comm"),
      release);
}

// NCCL calls on a communicator, their checks and failures.
void bindCommunicatorCalls(py::module_& testing) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  testing.def(
      "enqueue",
      [](Communicator& comm, const std::string& call) {
        // Every collective and point-to-point entry the fake scripts, with
        // no buffers: it enqueues nothing.
        const NcclApi& api = comm.api();
        const ncclComm_t c = comm.get();
        const auto f = ncclFloat;
        const std::unordered_map<std::string, std::function<ncclResult_t()>>
            calls{
                {"ncclAllReduce",
                 [&] {
                   return api.allReduce(
                       nullptr, nullptr, 0, f, ncclSum, c, nullptr);
                 }},
                {"ncclBroadcast",
                 [&] {
                   return api.broadcast(nullptr, nullptr, 0, f, 0, c, nullptr);
                 }},
                {"ncclReduce",
                 [&] {
                   return api.reduce(
                       nullptr, nullptr, 0, f, ncclSum, 0, c, nullptr);
                 }},
                {"ncclAllGather",
                 [&] {
                   return api.allGather(nullptr, nullptr, 0, f, c, nullptr);
                 }},
                {"ncclReduceScatter",
                 [&] {
                   return api.reduceScatter(
                       nullptr, nullptr, 0, f, ncclSum, c, nullptr);
                 }},
                {"ncclSend",
                 [&] { return api.send(nullptr, 0, f, 1, c, nullptr); }},
                {"ncclRecv",
                 [&] { return api.recv(nullptr, 0, f, 1, c, nullptr); }}};
        return static_cast<int>(calls.at(call)());
      },
      py::arg("comm"),
      py::arg("call"),
      "Calls NCCL entry point `call` on `comm` with no buffers; its result.");
  testing.def(
      "check",
      [](Communicator& comm, int result, const std::string& call) {
        comm.check(static_cast<ncclResult_t>(result), call.c_str());
      },
      py::arg("comm"),
      py::arg("result"),
      py::arg("call"),
      release,
      "Communicator::check, called from here (the caller it names).");
  testing.def(
      "op_failure",
      &opFailure,
      py::arg("label"),
      py::arg("cause"),
      "What an op that failed because of `cause` reports (failure.h).");
  testing.def(
      "set_timeout",
      [](Communicator& comm, std::chrono::milliseconds timeout) {
        comm.setTimeout(timeout);
      },
      py::arg("comm"),
      py::arg("timeout"));
}

// The backend's watchdog over a communicator of the fake.
void bindWatchdog(py::module_& testing) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  py::class_<WatchdogUnderTest>(
      testing,
      "Watchdog",
      "The backend's watchdog over a communicator of the fake NCCL.")
      .def(
          py::init<
              std::shared_ptr<Communicator>,
              c10::intrusive_ptr<c10d::Store>,
              std::string,
              std::string,
              std::chrono::milliseconds>(),
          py::arg("comm"),
          py::arg("store"),
          py::arg("group"),
          py::arg("abort_key"),
          py::arg("timeout"))
      .def_property_readonly("failure", &WatchdogUnderTest::failure)
      .def(
          "add_abort_hook",
          &WatchdogUnderTest::addAbortHook,
          py::arg("id"),
          py::arg("hook"))
      .def(
          "track_finished_op",
          &WatchdogUnderTest::trackFinishedOp,
          py::arg("seq"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "add_ephemeral_timeout",
          &WatchdogUnderTest::addEphemeralTimeout,
          py::arg("amount"),
          py::arg("first_seq"))
      .def_property_readonly(
          "ephemeral_timeout", &WatchdogUnderTest::ephemeralTimeout)
#if NCCL_CORE_HAS_COMPLETION_HOOKS
      .def(
          "add_completion_hook",
          &WatchdogUnderTest::addCompletionHook,
          py::arg("id"),
          py::arg("hook"))
#endif
      .def(
          "enqueue_all_reduce",
          &WatchdogUnderTest::enqueueAllReduce,
          py::arg("seq"),
          py::arg("timeout"),
          release)
      .def("stop", &WatchdogUnderTest::stop, release);
}

void bindFakeNccl(py::module_& testing) {
  bindFakeNcclClass(testing);
  bindCommunicatorMaking(testing);
  bindMeetings(testing);
  bindCommunicatorLife(testing);
  bindCommunicatorCalls(testing);
  bindWatchdog(testing);
}

} // namespace

void bindFlightRecorder(py::module_& testing) {
  py::class_<FlightRecorder>(
      testing,
      "FlightRecorder",
      "A flight recorder of its own (flight_recorder.h), fed by hand.")
      .def(py::init<size_t>(), py::arg("capacity"))
      .def(
          "add_group",
          &FlightRecorder::addGroup,
          py::arg("name"),
          py::arg("ranks"))
      .def(
          "record",
          [](FlightRecorder& recorder,
             size_t group,
             const std::string& desc,
             const std::string& name,
             uint64_t seq,
             bool sync,
             int rank,
             int peer,
             const std::vector<at::Tensor>& inputs,
             const std::vector<at::Tensor>& outputs) {
            return recorder.record(
                group,
                desc,
                TracedOp{
                    name.c_str(),
                    seq,
                    sync,
                    std::chrono::minutes(10),
                    rank,
                    peer},
                inputs,
                outputs);
          },
          py::arg("group"),
          py::arg("desc"),
          py::arg("name"),
          py::arg("seq"),
          py::arg("sync"),
          py::arg("rank"),
          py::arg("peer") = -1,
          py::arg("inputs") = std::vector<at::Tensor>{},
          py::arg("outputs") = std::vector<at::Tensor>{})
      .def("complete", &FlightRecorder::complete, py::arg("id"))
      .def(
          "sync_ops_finished_before",
          &FlightRecorder::syncOpsFinishedBefore,
          py::arg("group"),
          py::arg("seq"))
      .def(
          "dump",
          [](FlightRecorder& recorder, bool onlyActive) {
            return py::bytes(recorder.dump(onlyActive));
          },
          py::arg("only_active") = false);
}

} // namespace nccl_core

// The package's host-side logic over fakes, for the CPU tests: an extension
// of its own, linked to _C (whose objects it drives), never part of _C.
PYBIND11_MODULE(_testing, testing) {
  using namespace nccl_core;
  // The classes it hands out and takes (Communicator, the c10d Store).
  py::module_::import("torch_nccl_core._C");
  py::register_local_exception_translator(&translateErrors);
  py::class_<FakeTimeline>(
      testing,
      "SyncOpTimeline",
      "The watchdog's synchronous-op timeline over fake events: ops finish in "
      "order when complete_through says so; times are in ms.")
      .def(py::init<double>(), py::arg("span_ms"))
      .def("note", &FakeTimeline::note, py::arg("seq"), py::arg("now_ms"))
      .def("complete_through", &FakeTimeline::completeThrough, py::arg("seq"))
      .def("oldest", &FakeTimeline::oldest, py::arg("now_ms"))
      .def("span_count", &FakeTimeline::spanCount)
      .def("finished_before", &FakeTimeline::finishedBefore);
  testing.def(
      "refuse_nan",
      [](const std::string& op, const std::vector<at::Tensor>& sent) {
        refuseNan(op.c_str(), sent);
      },
      py::arg("op"),
      py::arg("sent"),
      "TORCH_NCCL_NAN_CHECK's check of the tensors an op sends.");
  bindFakeNccl(testing);
  bindFlightRecorder(testing);
  bindRoutes(testing);
  bindNcclCalls(testing);
}

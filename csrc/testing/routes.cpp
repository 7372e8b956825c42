// torch_nccl_core._testing.CommRoutes: the backend's routing over a
// communicator of the fake NCCL, with CPU tensors standing for NCCL memory.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/routing/comm_routes.h"
#include "nccl/allocations.h"
#include "nccl/caching_allocator_segments.h"
#include "python/registration_stats_dict.h"
#include "testing/bindings.h"

namespace py = pybind11;

namespace nccl_core {

namespace {

c10d::OpType opType(const std::string& op) {
  static const std::unordered_map<std::string, c10d::OpType> types{
      {"all_reduce", c10d::OpType::ALLREDUCE},
      {"all_gather", c10d::OpType::_ALLGATHER_BASE},
      {"reduce_scatter", c10d::OpType::_REDUCE_SCATTER_BASE},
      {"broadcast", c10d::OpType::BROADCAST}};
  const auto type = types.find(op);
  TORCH_CHECK_VALUE(type != types.end(), "unknown op '", op, "'");
  return type->second;
}

// Routes an op as launch() does and registers what it found unregistered:
// "group" or "twin", the communicator it runs on. `agree` stands for the
// ranks' meeting of a window upgrade: it gets this rank's vote and returns
// the tally.
std::string route(
    CommRoutes& routes,
    const std::string& op,
    const std::vector<at::Tensor>& outputs,
    const std::vector<at::Tensor>& inputs,
    bool routable,
    bool coalescing,
    const std::optional<AgreeFn>& agree) {
  Route route = routes.route(
      RouteQuery{
          opType(op),
          outputs,
          inputs,
          routable,
          false,
          std::nullopt,
          false,
          coalescing,
          agree ? &*agree : nullptr});
  const bool onTwin = &route.comm == routes.twin().get();
  routes.registerMemory(route);
  return onTwin ? "twin" : "group";
}

void bindRoutesClass(py::module_& testing) {
  py::class_<CommRoutes, std::shared_ptr<CommRoutes>>(
      testing,
      "CommRoutes",
      "The backend's routing (backend/routing/comm_routes.h) over a "
      "communicator of "
      "the fake NCCL, without engines.")
      .def(
          py::init([](std::shared_ptr<Communicator> comm,
                      bool autoRegister,
                      bool registerCachingAllocator,
                      bool windowUpgrade) {
            return CommRoutes::attach(
                std::move(comm),
                AutoRegistration{
                    autoRegister, registerCachingAllocator, windowUpgrade},
                {});
          }),
          py::arg("comm"),
          py::arg("auto_register") = true,
          py::arg("register_caching_allocator") = false,
          py::arg("window_upgrade") = false)
      .def(
          "route",
          &route,
          py::arg("op"),
          py::arg("outputs"),
          py::arg("inputs"),
          py::arg("routable") = true,
          py::arg("coalescing") = false,
          py::arg("agree") = py::none(),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "register_segments",
          [](CommRoutes& routes, const std::vector<at::Tensor>& tensors) {
            std::vector<Segment> segments;
            for (const at::Tensor& t : tensors) {
              segments.push_back(
                  {reinterpret_cast<uintptr_t>(t.data_ptr()),
                   static_cast<size_t>(t.nbytes()),
                   0});
            }
            return routes.registerSegments(segments);
          },
          py::arg("tensors"),
          py::call_guard<py::gil_scoped_release>(),
          "As register_mem_pool does, with these tensors as the segments.")
      .def_property_readonly("twin", &CommRoutes::twin)
      .def("set_timeout", &CommRoutes::setTimeout, py::arg("timeout"))
      .def("registration_stats", [](CommRoutes& routes) {
        return registrationStatsDict(routes.registrationStats());
      });
}

// The allocation table and the caching allocator's segment tracker.
void bindAllocations(py::module_& testing) {
  testing.def(
      "record_allocation",
      [](const at::Tensor& tensor, bool perTensor) {
        recordAllocation(
            tensor.data_ptr(),
            tensor.nbytes(),
            0,
            MemoryKind::Nccl,
            /*current=*/true,
            perTensor);
      },
      py::arg("tensor"),
      py::arg("per_tensor") = false,
      "Makes `tensor`'s memory count as NCCL memory of device 0: a pool's "
      "segment, or with `per_tensor` one tensor's own (as "
      "torch_nccl_core.empty's).");
  testing.def(
      "note_segment_event",
      [](const std::string& event, const at::Tensor& tensor) {
        static const std::unordered_map<std::string, SegmentEvent> events{
            {"alloc", SegmentEvent::Allocated},
            {"map", SegmentEvent::Mapped},
            {"free", SegmentEvent::Freed},
            {"unmap", SegmentEvent::Unmapped},
            {"existing", SegmentEvent::Existing}};
        noteSegmentEvent(
            events.at(event),
            reinterpret_cast<uintptr_t>(tensor.data_ptr()),
            tensor.nbytes(),
            0);
      },
      py::arg("event"),
      py::arg("tensor"),
      "What the caching allocator's tracker does when torch reports "
      "`event` (alloc, map, free, unmap; existing: found in torch's "
      "snapshot) of `tensor`'s memory on device 0.");
  testing.def(
      "caching_allocator_allocations",
      [] { return allocationCount(MemoryKind::CachingAllocator); },
      "How many caching-allocator segments the allocation table holds.");
  testing.def(
      "forget_allocation",
      [](const at::Tensor& tensor) { forgetAllocation(tensor.data_ptr()); },
      py::arg("tensor"),
      "As freeing NCCL memory does: what covers it is released first.");
}

// Windows of the fake's communicators, and the layouts NCCL would refuse.
void bindWindows(py::module_& testing) {
  testing.def(
      "register_window",
      [](Communicator& comm,
         const at::Tensor& tensor,
         int flags,
         const std::optional<std::vector<std::tuple<uint64_t, uint64_t>>>&
             parts) {
        // Every rank's part as this rank's, or as `parts` says: (allocation
        // bytes, offset) by rank, each of the tensor's size and `flags`.
        const auto place =
            comm.api().windowPlace(tensor.data_ptr(), tensor.nbytes());
        TORCH_CHECK(place.has_value(), "the fake refused the window");
        const WindowPart mine{
            place->allocationBytes, place->offset, tensor.nbytes(), flags};
        WindowLayout layout(comm.size(), mine);
        if (parts) {
          TORCH_CHECK(static_cast<int>(parts->size()) == comm.size());
          for (size_t rank = 0; rank < parts->size(); ++rank) {
            std::tie(layout[rank].allocationBytes, layout[rank].offset) =
                (*parts)[rank];
          }
        }
        return comm.registerWindow(
            tensor.data_ptr(), tensor.nbytes(), flags, std::move(layout));
      },
      py::arg("comm"),
      py::arg("tensor"),
      py::arg("flags"),
      py::arg("parts") = py::none(),
      py::call_guard<py::gil_scoped_release>());
  testing.def(
      "window_layout_conflict",
      [](const std::vector<
             std::tuple<uint64_t, uint64_t, uint64_t, int64_t, bool>>& parts,
         bool ownSizes) {
        WindowLayout layout;
        for (const auto& [allocation, offset, bytes, flags, refused] : parts) {
          layout.push_back({allocation, offset, bytes, flags, refused});
        }
        return layoutConflict(layout, ownSizes);
      },
      py::arg("parts"),
      py::arg("own_sizes"),
      "Why NCCL could not serve these parts (allocation bytes, offset, "
      "bytes, flags, refused; by rank) as one window; None where it could.");
}

} // namespace

void bindRoutes(py::module_& testing) {
  bindRoutesClass(testing);
  bindAllocations(testing);
  bindWindows(testing);
}

} // namespace nccl_core

// pybind11 classes of torch_nccl_core.communicator(): the communicator of a
// group and the resources it owns (nccl4py's nccl.core.resources and
// Communicator.register_buffer / register_window).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/backend.h"
#include "backend/ops/reduce_op.h"
#include "backend/routing/tensor_registration.h"
#include "nccl/dtypes.h"
#include "nccl/errors.h"
#include "nccl/window_pointers.h"
#include "python/communicator_bindings.h"

namespace py = pybind11;

namespace nccl_core {

namespace {

// The host scalar in the dtype NCCL will read it as.
std::shared_ptr<CustomRedOp>
createPreMulSum(Communicator& comm, double scalar, at::ScalarType dtype) {
  NCCL_CORE_CHECK_ARG_TYPE(
      at::isFloatingType(dtype) && ncclElementType(dtype).has_value(),
      "create_pre_mul_sum",
      "dtype must be a floating-point dtype "
      "NCCL reduces (float16, bfloat16, float32, float64), got ",
      dtype);
  const at::Tensor value =
      at::full({1}, scalar, at::TensorOptions().dtype(dtype));
  return comm.createPreMulSum(value.data_ptr(), ncclElementType(dtype)->dtype);
}

c10d::ReduceOp asReduceOp(const std::shared_ptr<CustomRedOp>& op) {
  op->get(); // raises if closed
  // Field by field: ReduceOp's (op, supplement) constructor drops the
  // supplement.
  c10d::ReduceOp reduceOp;
  reduceOp.op_ = c10d::ReduceOp::PREMUL_SUM;
  reduceOp.supplement_ = c10::make_intrusive<CustomRedOpSupplement>(op);
  return reduceOp;
}

// Long, but a list: one pybind11 definition per bound name.
void bindResources(py::module_& m) {
  py::class_<CommResource, std::shared_ptr<CommResource>>(
      m,
      "CommResource",
      "Base of the resources a communicator owns: released by close(), by "
      "freeing the memory they cover, or with their communicator.")
      .def("close", &CommResource::close, "Releases the resource; idempotent.")
      .def_property_readonly(
          "is_valid", &CommResource::isValid, "False once closed.");

  py::class_<RegisteredBuffer, CommResource, std::shared_ptr<RegisteredBuffer>>(
      m,
      "RegisteredBuffer",
      "A buffer registered with a communicator (ncclCommRegister).")
      .def_property_readonly("handle", &RegisteredBuffer::handle)
      .def_property_readonly("size", &RegisteredBuffer::size);

  const py::arg_v offset = py::arg("offset") = 0;
  const py::call_guard<py::gil_scoped_release> released;
  py::class_<Window, CommResource, std::shared_ptr<Window>>(
      m,
      "Window",
      "Memory registered by every rank together (ncclCommWindowRegister).")
      .def_property_readonly(
          "handle",
          [](const Window& w) { return reinterpret_cast<uintptr_t>(w.get()); })
      .def_property_readonly("size", &Window::size)
      .def_property_readonly("flags", &Window::flags)
      .def_property_readonly(
          "user_ptr",
          [](const Window& w) {
            return reinterpret_cast<uintptr_t>(w.userPtr());
          })
      .def("lsa_pointer", &lsaPointer, py::arg("lsa_rank"), offset, released)
      .def("peer_pointer", &peerPointer, py::arg("peer"), offset, released)
      .def("multimem_pointer", &multimemPointer, offset)
      .def("__enter__", [](std::shared_ptr<Window> w) { return w; })
      .def("__exit__", [](Window& w, const py::args&) { w.close(); });

  py::class_<CustomRedOp, CommResource, std::shared_ptr<CustomRedOp>>(
      m,
      "CustomRedOp",
      "A PreMulSum reduction (output = scalar * sum(inputs)) of one "
      "communicator.")
      .def_property_readonly(
          "op",
          [](const CustomRedOp& op) { return static_cast<int>(op.get()); })
      .def_property_readonly(
          "reduce_op",
          &asReduceOp,
          "A torch.distributed.ReduceOp running this op, for all_reduce, "
          "reduce and reduce_scatter on this group.");
}

} // namespace

void bindCommunicator(py::module_& m) {
  // The values of torch_nccl_core.WindowFlag, from NCCL's header.
  m.attr("NCCL_WIN_COLL_SYMMETRIC") = NCCL_WIN_COLL_SYMMETRIC;
  m.attr("NCCL_WIN_STRICT_ORDERING") = kWindowStrictOrdering;
  bindResources(m);
  py::class_<Communicator, std::shared_ptr<Communicator>>(
      m,
      "Communicator",
      "The NCCL communicator of an nccl_core group and the resources "
      "registered with it.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("device", &Communicator::device)
      .def_property_readonly(
          "lsa_size", [](Communicator& c) { return lsaTeam(c).size; })
      .def_property_readonly(
          "lsa_rank", [](Communicator& c) { return lsaTeam(c).rank; })
      .def_property_readonly("is_aborted", &Communicator::isAborted)
      .def(
          "register_buffer",
          [](Communicator& c, const at::Tensor& tensor) {
            checkRegistrable(c, tensor, "register_buffer");
            return c.registerBuffer(tensor.data_ptr(), tensor.nbytes());
          },
          py::arg("tensor"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "register_window",
          &registerTensorWindow,
          py::arg("tensor"),
          py::arg("flags") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "find_window",
          [](Communicator& c, const at::Tensor& tensor) {
            return c.findWindow(tensor.data_ptr(), tensor.nbytes());
          },
          py::arg("tensor"))
      .def(
          "create_pre_mul_sum",
          &createPreMulSum,
          py::arg("scalar"),
          py::arg("dtype"),
          py::call_guard<py::gil_scoped_release>())
      .def("_resource_count", &Communicator::resourceCount);
}

} // namespace nccl_core

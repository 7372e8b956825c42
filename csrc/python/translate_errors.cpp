#include "python/translate_errors.h"

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace nccl_core {

void translateErrors(std::exception_ptr error) {
  // Same mapping as torch's own bindings, for calls into this module.
  try {
    std::rethrow_exception(error);
  } catch (const c10::DistBackendError& e) {
    static py::handle distBackendError =
        py::object(
            py::module_::import("torch.distributed").attr("DistBackendError"))
            .release();
    PyErr_SetString(distBackendError.ptr(), e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

} // namespace nccl_core

#include "errors.hpp"

#include <map>

namespace expanse_py {
namespace {

// Status code -> exception class. The classes are defined in Python (expanse/_errors.py) because
// they derive from two bases (expanse.ExpanseError and ValueError, ...), which nb::exception cannot
// express. They live as long as the interpreter: the references are deliberately never released,
// so that no Python object is touched during static destruction.
std::map<int, PyObject*>& error_types() {
  static auto* types = new std::map<int, PyObject*>();
  return *types;
}

void set_error_types(nb::dict types) {
  for (auto [key, value] : types) {
    const int status = nb::cast<int>(key);
    if (!PyType_Check(value.ptr()) || !PyObject_IsSubclass(value.ptr(), PyExc_Exception))
      throw nb::type_error("_set_error_types: values must be exception classes");
    auto& slot = error_types()[status];
    Py_XDECREF(slot);
    slot = value.inc_ref().ptr();
  }
}

}  // namespace

void raise_status(expanse_status status, const std::string& message) {
  auto it = error_types().find(static_cast<int>(status));
  PyObject* type = it != error_types().end() ? it->second : PyExc_RuntimeError;
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void raise_type_error(const std::string& message) {
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

void bind_errors(nb::module_& m) {
  m.def("_set_error_types", &set_error_types, nb::arg("types"),
        "Registers the exception class raised for each expanse_status code (used by expanse/_errors.py).");
}

}  // namespace expanse_py

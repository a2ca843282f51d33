// expanse._expanse: the private extension under the pure-Python package `expanse`. It wraps the C
// ABI of libexpanse.so (which sits beside it in the installed package, found through RPATH $ORIGIN,
// with the backend plugins beside it in turn). Defaults, output shapes and dtypes, and the choice of
// framework for results are the Python layer's business (expanse/_ops.py).
#include <dlfcn.h>

#include <nanobind/nanobind.h>

#include "expanse/expanse.h"

namespace nb = nanobind;

namespace expanse_py {
void bind_errors(nb::module_& m);
void bind_info(nb::module_& m);
void bind_tensors(nb::module_& m);
void bind_memory(nb::module_& m);
void bind_run(nb::module_& m);
void bind_check(nb::module_& m);
}  // namespace expanse_py

namespace {

// Python loads extension modules with RTLD_LOCAL, so libexpanse (loaded as this module's dependency)
// would keep its symbols to itself. A backend plugin that calls back into the core (expanse_op_name,
// ...) without linking libexpanse then fails to load, where the `expanse` command, which links
// libexpanse directly, loads it fine. Promote libexpanse to the global scope before the registry
// looks for plugins (on the first call), so that plugins load here as they do there.
void promote_libexpanse_to_global_scope() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&expanse_version), &info) != 0 && info.dli_fname != nullptr)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);  // already loaded: only the scope changes
}

}  // namespace

NB_MODULE(_expanse, m) {
  m.doc() = "Private extension of the expanse package; use the functions of `expanse` instead.";
  promote_libexpanse_to_global_scope();
  expanse_py::bind_errors(m);
  expanse_py::bind_info(m);
  expanse_py::bind_tensors(m);
  expanse_py::bind_memory(m);
  expanse_py::bind_run(m);
  expanse_py::bind_check(m);
}

// Errors of the extension: a non-OK expanse_status becomes the Python exception class that the
// package registered for it (expanse.InvalidArgumentError is a ValueError, expanse.UnsupportedError a
// NotImplementedError, ...), carrying the library's message, which names the offending argument.
#pragma once

#include <string>

#include <nanobind/nanobind.h>

#include "expanse/expanse.h"

namespace expanse_py {

namespace nb = nanobind;

// Sets the Python error for `status` and throws nb::python_error.
[[noreturn]] void raise_status(expanse_status status, const std::string& message);

// Throws for a non-OK status, with the calling thread's expanse_last_error() as the message.
inline void check(expanse_status status) {
  if (status != EXPANSE_OK) raise_status(status, expanse_last_error());
}

// A TypeError (an argument that is no array, or an array of a dtype the library has no code for).
[[noreturn]] void raise_type_error(const std::string& message);

// _set_error_types(dict[int, type]): the package's exception class for each status code.
void bind_errors(nb::module_& m);

}  // namespace expanse_py

// Errors inside libexpanse: validation and dispatch throw api_error; every C entry point catches it
// (through guarded()) and turns it into a status plus the thread-local last-error text. Nothing
// throws across the C ABI.
#pragma once

#include <cstdarg>
#include <exception>
#include <string>

#include "expanse/expanse.h"

namespace expanse::detail {

struct api_error {
  expanse_status status;
  std::string message;
};

// printf-style message; throws api_error{status, text}.
[[noreturn]] void fail(expanse_status status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// The status of a public entry point called from inside another (within guarded): fails with that
// call's status and last error.
void call(expanse_status st);

// Records the last error of this thread and returns status (EXPANSE_OK clears the text).
expanse_status set_last_error(expanse_status status, const std::string& message);

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vformat(const char* fmt, va_list args);

// Runs body() and converts any exception into a status with the last-error text set.
template <class Body>
expanse_status guarded(Body&& body) noexcept {
  try {
    body();
    return set_last_error(EXPANSE_OK, "");
  } catch (const api_error& e) {
    return set_last_error(e.status, e.message);
  } catch (const std::bad_alloc&) {
    return set_last_error(EXPANSE_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return set_last_error(EXPANSE_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return set_last_error(EXPANSE_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace expanse::detail

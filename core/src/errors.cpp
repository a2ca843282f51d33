#include "errors.hpp"

#include <cstdio>
#include <new>
#include <vector>

namespace expanse::detail {

namespace {
thread_local std::string last_error_text;
}

std::string vformat(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::vector<char> buf(static_cast<size_t>(n) + 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, args);
  return std::string(buf.data(), static_cast<size_t>(n));
}

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vformat(fmt, args);
  va_end(args);
  return s;
}

void fail(expanse_status status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vformat(fmt, args);
  va_end(args);
  throw api_error{status, std::move(s)};
}

void call(expanse_status st) {
  if (st != EXPANSE_OK) fail(st, "%s", expanse_last_error());
}

expanse_status set_last_error(expanse_status status, const std::string& message) {
  last_error_text = message;
  return status;
}

}  // namespace expanse::detail

extern "C" EXPANSE_API const char* expanse_last_error(void) {
  return expanse::detail::last_error_text.c_str();
}

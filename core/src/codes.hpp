// The integer codes of the C ABI's enums (dtype, op kind, status, ...), read and named safely.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "expanse/expanse.h"

namespace expanse::detail {

// The integer a C caller passed as an enum argument. C may pass any int for an enum type, and in
// C++ loading an enum object that holds a value outside its enumerators' range is undefined, so an
// entry point reads the code's bytes (by reference: passing by value would load it) before
// checking it.
template <class Enum>
int32_t enum_code(const Enum& value) {
  static_assert(std::is_enum_v<Enum> && sizeof(Enum) == sizeof(int32_t), "a C ABI enum");
  int32_t code;
  std::memcpy(&code, &value, sizeof(code));
  return code;
}

// Element size of a dtype code; 0 for a code that is no dtype.
size_t dtype_size_of(int32_t dtype);
// "f16", "bf16", "f32", "f64"; "unknown" for a code that is no dtype.
const char* dtype_name_of(int32_t dtype);

}  // namespace expanse::detail

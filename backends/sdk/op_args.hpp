// Reading an operation's arguments in a plugin, which must not call into libexpanse (the core loads
// plugins RTLD_LOCAL, and Python loads the core RTLD_LOCAL too): the typed args, the first tensor
// (where a backend finds the call's device) and the operation's name, all from expanse.h alone.
#pragma once

#include <cstring>
#include <type_traits>
#include <utility>

#include "expanse/backend.h"

namespace expanse_sdk {

// Every args struct starts with a tensor (expanse.h): an aggregate whose first member takes a
// `const expanse_tensor*` is constructible from one alone.
template <class Args, class = void>
struct starts_with_tensor : std::false_type {};
template <class Args>
struct starts_with_tensor<Args, std::void_t<decltype(Args{std::declval<const expanse_tensor*>()})>>
    : std::bool_constant<std::is_standard_layout_v<Args>> {};
#define EXPANSE_SDK_CHECK_FIRST_TENSOR(name, NAME)                        \
  static_assert(starts_with_tensor<expanse_##name##_args>::value,        \
                "expanse_" #name "_args must start with a const expanse_tensor*");
EXPANSE_OPERATIONS(EXPANSE_SDK_CHECK_FIRST_TENSOR)
#undef EXPANSE_SDK_CHECK_FIRST_TENSOR

// The first tensor of any operation's args (null only for an args struct the core never sends).
inline const expanse_tensor* first_tensor(const expanse_op& op) {
  const expanse_tensor* t = nullptr;
  if (op.args != nullptr) std::memcpy(&t, op.args, sizeof(t));
  return t;
}

// The device an operation runs on: its first tensor's (the core has checked that all its tensors
// share it).
inline int32_t device_of(const expanse_op& op) {
  const expanse_tensor* t = first_tensor(op);
  return t != nullptr ? t->device_id : 0;
}

template <class Args>
const Args& args_of(const expanse_op& op) {
  return *static_cast<const Args*>(op.args);
}

// Sets t's strides to those of a dense row-major tensor of its shape; returns its element count.
inline int64_t set_dense_strides(expanse_tensor& t) {
  int64_t count = 1;
  for (int dim = t.ndim - 1; dim >= 0; --dim) {
    t.strides[dim] = count;
    count *= t.shape[dim];
  }
  return count;
}

// "power_attention", ...; "unknown op" for a code that is no operation.
inline const char* op_name(expanse_op_kind kind) {
#define EXPANSE_SDK_OP_NAME(name, NAME) #name,
  static const char* const names[] = {EXPANSE_OPERATIONS(EXPANSE_SDK_OP_NAME)};
#undef EXPANSE_SDK_OP_NAME
  return kind >= 0 && kind < EXPANSE_OP_COUNT ? names[kind] : "unknown op";
}

}  // namespace expanse_sdk

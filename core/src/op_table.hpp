// The tensor arguments of every operation (op_table.cpp).
#pragma once

#include <cstdint>

#include "expanse/expanse.h"

namespace expanse::detail {

struct op_tensor_table {
  const expanse_tensor_arg_info* args;
  int32_t count;
  size_t args_size;  // sizeof the op's *_args struct
};

// The table of op `kind`, or nullptr for a code that is no operation.
const op_tensor_table* op_tensors(int32_t kind);
// The tensor pointer stored in the args struct's field `info` (may be NULL).
const expanse_tensor* tensor_at(const void* args, const expanse_tensor_arg_info& info);
// Whether any output (or in-place argument) of a validated op has an element to write.
bool writes_anything(const op_tensor_table& table, const void* args);

}  // namespace expanse::detail

// The declaration of every operation (op_table.cpp): its arguments struct, its tensors with their
// roles, shape rules and dtype rules, and its parameters with their defaults and checks. Validation
// (validate.cpp), the _args_init functions, the output shapes of the C ABI and every tool that walks
// expanse_op_tensor_args / expanse_op_params derive from it; nothing else spells out an operation.
#pragma once

#include <cstdint>

#include "expanse/expanse.h"

namespace expanse::detail {

// Which dtypes a tensor takes.
enum class dtype_rule : uint8_t {
  any_float,    // f16, bf16, f32 or f64
  state_float,  // f32 or f64 (states, gates, intra-chunk sums)
  same_as,      // the dtype of tensor `other`
  output_of,    // the dtype of tensor `other`, or f64 (the reference's oracle outputs)
};

// What a present tensor tells the backend (expanse_problem's flags).
enum tensor_flag : uint8_t {
  kGates = 1,    // log_g: gated
  kInitial = 2,  // an initial state: has_initial_state
  kFinal = 4,    // a final state: want_final_state
  kIntra = 8,    // query_state's intra-chunk result: has_intra
  kState = 16,   // its dtype is the problem's state_dtype
  kPrimary = 32, // its dtype is the problem's output_dtype
};

struct tensor_decl {
  expanse_tensor_arg_info info;  // name, offset, role, required, dims (public)
  dtype_rule dtype;
  const char* other = nullptr;   // for same_as / output_of
  uint8_t flags = 0;
  const char* needs = nullptr;   // another tensor that must be present with this one
  bool with_normalize = false;   // required when normalize=1 (and `needs`, if any, is present)
  uint8_t group = 0;             // tensors of one nonzero group are given together or not at all
};

// How a parameter is checked.
enum class param_check : uint8_t {
  degree,        // p in 1..max_p
  scale,         // finite; 0 means 1/sqrt(d)
  flag,          // 0 or 1 (normalize: needs an even p when 1)
  layout,        // a known kind; tiled needs d_tile >= 1 and d % d_tile == 0
  chunk,         // >= 1
  chunk_or_all,  // >= 0; 0 means one chunk over the whole sequence
  chunk_or_auto, // >= 0 (0: the quadratic form) or EXPANSE_CHUNK_AUTO: the backend chooses
};

struct param_decl {
  expanse_param_info info;  // name, offset, type, default, help (public)
  param_check check;
};

struct op_decl {
  const char* name;
  size_t args_size;
  const tensor_decl* tensors;
  int32_t tensor_count;
  const param_decl* params;
  int32_t param_count;
  const char* positive;  // symbols that must be >= 1, e.g. "d e h hq"
  int32_t max_p;         // 0: no degree
  // Public views of the tables, built from tensors / params.
  const expanse_tensor_arg_info* tensor_infos;
  const expanse_param_info* param_infos;
};

// The declaration of op `kind`, or nullptr for a code that is no operation.
const op_decl* op_declaration(int32_t kind);
// The tensor pointer stored in the args struct's field `info` (may be NULL).
const expanse_tensor* tensor_at(const void* args, const expanse_tensor_arg_info& info);
// Whether any output (or in-place argument) of a validated op has an element to write.
bool writes_anything(const op_decl& op, const void* args);
// Sets every parameter of args to its default and every tensor pointer to NULL.
void init_args(const op_decl& op, void* args);

}  // namespace expanse::detail

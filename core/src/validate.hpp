// Validation of every operation's arguments against docs/spec.md "Bad input", before any backend sees
// them, by the declarations of op_table.cpp. The result is the problem (derived sizes) plus the
// argument struct a backend receives.
#pragma once

#include "expanse/backend.h"

namespace expanse::detail {

struct device_requirement {
  int32_t device_type;  // tensors must live here
  int32_t device_id;    // checked for non-CPU devices
  // power_attention's chunk size for EXPANSE_CHUNK_AUTO (the backend's rule); sees every field of
  // the problem but c and n.
  int64_t (*choose_chunk_size)(const expanse_problem* problem);
};

// Room for the largest *_args struct and its tensors (static_asserts in validate.cpp).
constexpr size_t kMaxArgsSize = 256;
constexpr int kMaxTensorArgs = 24;

struct validated_op {
  expanse_problem problem{};
  const void* args = nullptr;  // what the backend gets: the caller's struct, or `canonical_args`
  // Tensors that may omit an axis of size 1 (power_attention_step's [b,hq,d] for [b,1,hq,d]) reach
  // backends in their full form: a copy of the caller's struct pointing at full views.
  alignas(16) unsigned char canonical_args[kMaxArgsSize]{};
  expanse_tensor canonical_tensors[kMaxTensorArgs]{};
  // power_attention: the chunk size it runs with (EXPANSE_CHUNK_AUTO resolved; 0: quadratic).
  int64_t chunk_size = 0;
  // The backend's memo of this call (expanse_op::memo), zeroed with the rest.
  int64_t memo[EXPANSE_OP_MEMO_WORDS]{};
};

// Throws api_error(EXPANSE_ERROR_INVALID_ARGUMENT) naming the argument and the expected value.
// `kind` is the caller's integer code of an expanse_op_kind (checked here).
void validate_op(int32_t kind, const void* args, const device_requirement& device, validated_op& out);

// The shape (and default dtype) of output `arg` of op `kind` for the inputs in args, which are
// validated as by validate_op but for their device and data (expanse_output_shape).
void output_shape(int32_t kind, const void* args, int32_t arg, int32_t* ndim, int64_t* shape, int32_t* dtype);

}  // namespace expanse::detail

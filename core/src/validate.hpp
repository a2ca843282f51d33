// Validation of every operation's arguments against docs/spec.md "Bad input", before any backend sees
// them. The result is the problem (derived sizes) plus the argument struct a backend receives.
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

struct validated_op {
  expanse_problem problem{};
  const void* args = nullptr;  // what the backend gets: the caller's struct, or a canonical copy
  // power_attention_step accepts [b,hq,d] and [b,1,hq,d]; backends always see the rank-4 form.
  expanse_power_attention_step_args step_args{};
  expanse_tensor step_tensors[7]{};
  // power_attention: the chunk size it runs with (EXPANSE_CHUNK_AUTO resolved; 0: quadratic).
  int64_t chunk_size = 0;
  // The backend's memo of this call (expanse_op::memo), zeroed with the rest.
  int64_t memo[EXPANSE_OP_MEMO_WORDS]{};
};

// Throws api_error(EXPANSE_ERROR_INVALID_ARGUMENT) naming the argument and the expected value.
// `kind` is the caller's integer code of an expanse_op_kind (checked here).
void validate_op(int32_t kind, const void* args, const device_requirement& device, validated_op& out);

}  // namespace expanse::detail

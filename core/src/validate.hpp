// Validation of every operation's arguments against SPEC.md "Bad input", before any backend sees
// them. The result is the problem (derived sizes) plus the argument struct a backend receives.
#pragma once

#include "expanse/backend.h"

namespace expanse::detail {

struct device_requirement {
  int32_t device_type;  // tensors must live here
  int32_t device_id;    // checked for non-CPU devices
};

struct validated_op {
  expanse_problem problem{};
  const void* args = nullptr;  // what the backend gets: the caller's struct, or a canonical copy
  // power_attention_step accepts [b,hq,d] and [b,1,hq,d]; backends always see the rank-4 form.
  expanse_power_attention_step_args step_args{};
  expanse_tensor step_tensors[7]{};
};

// Throws api_error(EXPANSE_ERROR_INVALID_ARGUMENT) naming the argument and the expected value.
void validate_op(expanse_op_kind kind, const void* args, device_requirement device,
                 validated_op& out);

}  // namespace expanse::detail

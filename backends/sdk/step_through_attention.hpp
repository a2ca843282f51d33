// power_attention_step of several tokens (t > 1: speculative decoding, or a prompt appended to a
// state) as power_attention through the backend's own list, so that the step gains whatever makes
// the forward fast: the state, copied into the workspace, is the initial state, and S, z are written
// back as the final state (docs/spec.md "Recurrent form"). The chunk size is the core's choice for
// power_attention at t (expanse_problem c, n). Every backend ends its step list with it; the one-token
// kernels before it decline t != 1.
#pragma once

#include <string>

#include "sdk/implementation.hpp"

namespace expanse_sdk {

// Why a one-token kernel declines a step of t != 1 tokens (empty for t = 1).
inline std::string one_token_declines(const expanse_problem& pb) {
  return pb.t == 1 ? std::string() : "takes one token; t != 1 runs as power_attention (attention)";
}

// The backend's copy of a state tensor `from` ([b,h,D,e] or [b,h,D], any strides) into `to`, a dense
// tensor of the same shape and dtype, on lc's stream.
using copy_state_fn = void (*)(const expanse_tensor& from, const expanse_tensor& to, launch_context& lc);

// Runs the step `op` (any t >= 0; nothing for t = 0) as described above.
void run_step_through_attention(const expanse_op& op, launch_context& lc, copy_state_fn copy);

}  // namespace expanse_sdk

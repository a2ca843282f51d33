// discumsum's launcher, and its arguments as a step of power_attention.
#pragma once

#include "gpu/ops/common.hpp"

namespace expanse_gpu {

// discumsum as a step of power_attention: Y holds the n states entering the chunks (in place over X)
// and the state after the last chunk goes to final_state (null: not wanted), which the public
// operation's Y (n + 1 slots) cannot express. The step's problem has want_final_state set, which a
// public discumsum's never has; its A may be absent (no gates: no decay).
struct discumsum_step_args {
  expanse_discumsum_args op;
  const expanse_tensor* final_state;
};

// Y [b,n,h,...] f32 (states entering each chunk, scanned from zero) += the initial state init
// [b,h,...] decayed to each chunk by A [b,n,h] (empty: no decay): add_initial_kernel.
void launch_add_initial(const expanse_tensor& Y, const expanse_tensor& A, const expanse_tensor& init, int64_t n,
                        stream_t stream);

}  // namespace expanse_gpu
